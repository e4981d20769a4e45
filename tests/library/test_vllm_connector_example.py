"""examples/vllm_connector.py: the KV-connector-shaped handoff (scheduler and worker
sides, per layer, per rank, vLLM's packed caches registered on both sides, the
scheduler's block ids, a local prefix left alone) lands the prefill side's KV in the
decode engine's own blocks; a corrupt chunk fails the load, is reported, and keeps no
block but the engine's prefix hit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm_connector.py"


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("vllm_connector", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm_connector"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_connector_hands_off_layer_by_layer_per_rank() -> None:
    got = _example().run()
    assert got["decode_state"] == "done" and got["saved"] == ["done", "done"]
    assert got["kv_equal"] and got["prefix_untouched"] and got["failed"] == []
    # the decode request owns vLLM's 3 received blocks and references its 2 prefix
    # blocks; each prefill rank handed its 3 blocks back once acked (vLLM frees them)
    assert got["kvown_blocks"] == [{"owned": 5}, {}, {}]
    assert got["freeable"] == [12, 0, 5] and got["released"] == [[4, 1, 6], [0, 2, 5]]


def test_a_corrupt_chunk_fails_the_load_and_keeps_nothing() -> None:
    got = _example().run(corrupt=True)
    assert got["decode_state"] == "aborted" and got["saved"] == ["aborted", "aborted"]
    assert got["failed"] == ["req-1"] and not got["kv_equal"] and got["prefix_untouched"]
    # the decode side keeps only the engine's prefix hit (2 blocks), its 3 destination
    # blocks given back at once; each prefill rank handed its blocks back at the failure
    assert got["kvown_blocks"] == [{"owned": 2}, {}, {}]
    assert got["freeable"] == [12, 0, 5] and got["released"] == [[4, 1, 6], [0, 2, 5]]
