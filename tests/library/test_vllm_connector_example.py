"""examples/vllm_connector.py: the KV-connector-shaped handoff (scheduler and worker
sides, per layer, per TP rank, the engines' caches registered on both sides, the
schedulers' block ids) for FlashAttention, FlashInfer, packed HND and cross-layer
caches, prefill TP 2 -> decode TP 1 and 1 -> 2, block size 16 -> 32, a decode-side
prefix hit and a chunked prefill of two chunks: bit-exact in the decode engines' own
tensors (read by plain indexing), no kvown pool on either side (every ``KVPool`` built
is a block-size change's staging, and none outlives the run), every block given back to
the engines at the end. A corrupt chunk fails the load, is reported, and keeps nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.library.lib_helpers import Census

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm_connector.py"


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("vllm_connector", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm_connector"] = mod
    spec.loader.exec_module(mod)
    return mod


EX = _example()


@pytest.mark.parametrize(("kind", "src_tp", "dst_tp"), EX.SCENARIOS,
                         ids=[f"{k}-tp{s}to{d}" for k, s, d in EX.SCENARIOS])  # fmt: skip
def test_connector_hands_off_two_chunks_per_rank(
    kind: str, src_tp: int, dst_tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    census = Census(monkeypatch)
    got = EX.run(kind, src_tp, dst_tp)
    assert got["decode_states"] == [["done"] * dst_tp] * 2  # both chunks, every decode rank
    assert got["saved"] == [["done"] * src_tp] * 2
    assert got["kv_equal"] and got["prefix_untouched"] and got["failed"] == []
    assert got["memory"] == ["RegisteredPool"]  # the engines' caches on every rank
    assert census.kvown_pools() == 0 and census.built  # only staging (16 -> 32) was built
    assert census.alive() == 0  # and none outlives its attempt
    # each decode rank: the local hit (block 9), chunk 0's block 3, chunk 1's block 12;
    # each prefill rank: the 6 blocks of the prompt, adopted chunk by chunk
    assert got["kvown_blocks"] == [{"owned": 3}] * dst_tp + [{"owned": 6}] * src_tp
    # chunk 1's block is freeable at its commit; chunk 0's is chunk 1's prefix: pinned
    assert got["freeable"] == [[[12], []]] * dst_tp
    assert got["decode_released"] == [[[12], [3], [9]]] * dst_tp
    assert got["released"] == [EX.PRE_TABLE] * src_tp  # acked: the engine frees them
    assert got["left"] == [{}] * (src_tp + dst_tp)


def test_a_corrupt_chunk_fails_the_load_and_keeps_nothing() -> None:
    got = EX.run(corrupt=True)
    assert got["decode_states"] == [["aborted"]] and got["saved"] == [["aborted", "aborted"]]
    assert got["failed"] == ["req-1/c0"] and not got["kv_equal"] and got["prefix_untouched"]
    # the decode side keeps only the engine's prefix hit, chunk 0's block given back at
    # once (freeable); chunk 1 was never sent; each prefill rank held chunk 0's 4 blocks
    assert got["kvown_blocks"] == [{"owned": 1}, {"owned": 4}, {"owned": 4}]
    assert got["freeable"] == [[[], [3]]] and got["decode_released"] == [[[], [3], [9]]]
    assert got["released"] == [[4, 1, 6, 0]] * 2 and got["left"] == [{}, {}, {}]
