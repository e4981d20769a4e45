"""Decode ranks streamed layer by layer on the API tour (issue #30 item 4):
``ranks_stream_one`` (decode TP 2 with decode ranks, 2 layers, one attempt) on one
``RankSender`` per prefill rank and one ``RankReceiver`` per decode rank
(``on_api/worlds/rank_stream.py``): ``PrefillSendLayer`` is every prefill rank's
``send_layer`` (each sub-handoff copies its decode rank's slice at once); the map's
``cpy`` is the fewest layers any sub-handoff's Sender copied, ``inl`` the fewest any
decode rank has in its blocks; ``DecodeLayerReady`` asks every decode rank; a freed
source's replica is the sub-Senders' copies, each checked against its rank's heads.
Before, the adapter refused decode ranks streamed layer by layer by name."""

from __future__ import annotations

import pytest
import torch

from refimpl import KVGeometry, State, read_kv, write_kv_layer
from refimpl.api.ranks import Epochs, RankReceiver, RankSender
from refimpl.api.switches import SLICE_READ_AT_READY
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.tour import api_report, gap_of, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import MODEL
from tests.library.tours.tour_helpers import assert_every_pair, assert_machine_walks

WORLD = "ranks_stream_one"
PAIRS = (42, 42)  # measured: reachable pairs, covered
EDGES = (1719, 1694)  # measured: closed edges, covered (the rest: the layer-chunk gap)
LAYER_CHUNKS = {  # on_api.gaps: the API's chunk is one layer, the spec's every layer
    "state differs at PrefillRecvReady (net)",
    "state differs at PrefillSendLayer (net)",
}
SEND_LAYER_KILLS = 7  # measured: of the pair walks, those that take a PrefillSendLayer


def test_every_pair_of_decode_ranks_streamed_layer_by_layer() -> None:
    assert unexpressed(get_world(WORLD)) == []
    assert unexpressed(get_world(WORLD), remote=True) == ["decode_ranks"]
    assert_every_pair(WORLD, PAIRS)


def test_the_hypothesis_machine_walks_decode_ranks_streamed() -> None:
    """Its examples end at no divergence but the named layer-chunk gap (measured: 4 of
    10 examples end there)."""
    assert_machine_walks(WORLD, frozenset(LAYER_CHUNKS))


@pytest.mark.nightly
def test_every_edge_of_decode_ranks_streamed_but_the_named_layer_chunks() -> None:
    """1694/1719 edges, 640 walks (12 CPU s): the walks that diverge are the streamed
    world's named layer-chunk gap alone (``stream_one``'s, tests/behaviours/test_stream.py),
    with the same counts."""
    plan = plan_api(get_world(WORLD))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES, rep
    assert {gap_of(e) for _, e in res.failures} == LAYER_CHUNKS  # type: ignore[arg-type]


def test_the_tour_kills_a_rank_sender_whose_slices_are_read_at_ready() -> None:
    """``slice_read_at_ready``: a RankSender gives each narrower decode rank's
    sub-handoff a view of its heads at ``send_layer``, no copy. The map reads each
    sub-Sender's copies (``Stream.copied``): every walk diverges at its first
    ``PrefillSendLayer``, the spec's copy there missing."""
    plan = plan_api_pairs(get_world(WORLD))
    res = run_api_tour(ApiAdapter(), plan, frozenset({SLICE_READ_AT_READY}))
    kinds = api_report(plan, res)["divergences"]
    assert kinds == {"state differs at PrefillSendLayer (cpy)": SEND_LAYER_KILLS}, kinds


@pytest.mark.parametrize("mutant", [False, True])
def test_a_streamed_rank_slice_leaves_as_sent_even_if_the_blocks_are_reused(
    mutant: bool,
) -> None:
    """Prefill TP 1 -> decode TP 2, streamed: every layer given before decode's ready,
    then the blocks freed and reused (overwritten) as a streamed offer allows. Each
    decode rank commits its heads of the bytes at ``send_layer``; with the switch, the
    reused blocks' bytes, sealed as the request's, with no error."""
    src = KVGeometry(2, 2, 8, 4, "float32", tp=1)
    dst = KVGeometry(2, 2, 8, 4, "float32", tp=2)
    t, epochs, n = InProcessTransport(), Epochs(), 8
    sp = src.make_rank_pools(0, 4)
    dp = [dst.make_rank_pools(d, 4) for d in range(2)]
    tx = RankSender(sp, src, t, MODEL, rank=0, dst_tp=2, epochs=epochs,
                    mutants=frozenset({SLICE_READ_AT_READY} if mutant else ()))  # fmt: skip
    rx = [RankReceiver(p, dst, t, MODEL, rank=d, src_tp=1) for d, p in enumerate(dp)]
    kv = torch.randn(2, 2, 2, n, 8, generator=torch.Generator().manual_seed(3))
    blocks = sp.alloc.allocate("r", src.blocks_for(n))
    epochs.open("r")
    tx.offer("r", list(range(n)), blocks=blocks)
    for layer in range(2):
        write_kv_layer(sp, "r", blocks, layer, [kv[layer, 0], kv[layer, 1]])
        tx.send_layer("r", layer)
    sp.alloc.free("r")  # the source goes back, and another request's KV lands there
    for pool in sp.pools:
        pool.kv.fill_(-1.0)
    for _ in range(20):
        for x in [*rx, tx]:
            x.poll("r")
    for d, (r, p) in enumerate(zip(rx, dp, strict=True)):
        assert r.ready("r") and r.state("r") is State.DONE  # either way: the bug is silent
        got = read_kv(p, r.blocks("r"), n)
        assert torch.equal(got, kv[:, :, d : d + 1]) is not mutant, d
