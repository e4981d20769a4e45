"""examples/hf_llama_handoff.py: a transformers Llama's prefill cache handed off, decoded
greedily, identical to decoding without the handoff; every refusal leaks 0 blocks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("transformers")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_llama_handoff.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hf_llama_handoff", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_json_every_variant_identical_every_refusal_clean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _example().main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in out["variants"]] == [
        "same_layout",
        "tp2_to_tp1",
        "block16_to_block8_tokens_major",
        "offload_round_trip_on_decode",
        "mistral_sliding_window_full_prefill_tp2_to_tp1",
    ]
    for v in out["variants"]:
        assert v["tokens_identical"] is True and v["max_abs_dlogits"] == 0.0
        assert len(set(v["tokens"])) > 1  # a real greedy continuation, not one repeated id
    assert {r["name"]: (r["refused"], r["leaked_blocks"]) for r in out["refusals"]} == {
        "corrupt_chunk": (True, 0),
        "manifest_mismatch_rope_theta": (True, 0),
        "full_receiver": (True, 0),
        "mistral_sliding_window_cache": (True, 0),
    }
    sliding = next(r for r in out["refusals"] if r["name"] == "mistral_sliding_window_cache")
    assert "sliding-window layer" in sliding["error"]


def test_the_comparison_sees_a_one_value_change_in_the_kv() -> None:
    """The variants' check has teeth: one changed key element changes the logits."""
    ex = _example()
    cfg, model = ex.build_model()
    with torch.no_grad():
        out = model(input_ids=torch.arange(20).view(1, 20), use_cache=True)
    first = out.logits[0, -1]
    legacy = tuple((layer.keys.clone(), layer.values.clone()) for layer in out.cache.layers)
    legacy[1][0][0, 1, 3, 5] += 1e-3
    from refimpl.adapters.hf import blocks_to_cache, cache_to_blocks
    from refimpl.api import KVGeometry

    g = KVGeometry.from_hf_config(cfg)
    pools = g.make_pools(4)
    blocks = pools.alloc.allocate("r", 2)
    cache_to_blocks(legacy, pools, "r", blocks)
    _, bad = ex.greedy(model, first, blocks_to_cache(pools, blocks, 20))
    _, ref = ex.greedy(model, first, out.cache)
    assert (bad - ref).abs().max() > 0
