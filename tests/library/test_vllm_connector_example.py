"""examples/vllm_connector.py: the KV-connector-shaped handoff (scheduler and worker
sides, per layer, per rank, packed vLLM caches, a local prefix left alone) lands the
prefill side's KV; a corrupt chunk fails the load, is reported, and keeps no block."""

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
    assert got["kvown_blocks"] == [{"owned": 3}, {}, {}]  # 37 + 8 tokens of room at bs 16


def test_a_corrupt_chunk_fails_the_load_and_keeps_nothing() -> None:
    got = _example().run(corrupt=True)
    assert got["decode_state"] == "aborted" and got["saved"] == ["aborted", "aborted"]
    assert got["failed"] == ["req-1"] and not got["kv_equal"] and got["prefix_untouched"]
    # nothing on the decode side; each prefill rank keeps only the request's own blocks
    # (no pin: the engine frees them when the request finishes)
    assert got["kvown_blocks"] == [{}, {"owned": 3}, {"owned": 3}]
