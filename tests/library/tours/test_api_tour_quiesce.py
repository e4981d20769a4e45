"""An unrevocable transport (``revocable=False``): a writer says Quiesced only once its
writes are over, and a quarantine holds until every writer said it (issue #30 item 1).

- A ``Sender`` whose ``abort`` (a cancel, the engine's timeout) comes while writes of
  the attempt are still pending at the transport keeps the attempt and its pins, and
  tells the receiver (its Quiesced) at the first ``poll`` after they are over: the spec
  refuses ``PrefillTimeout`` there (NoReuseUnderIO). The tour gives the Senders the
  engine's abort early (``on_api.early.early_aborts``) and kills the bug switch
  ``quiesced_at_abort``; a public-API test reorders the last write behind the abort.
- With one ``Sender(rank=r)`` per prefill rank, the Receiver frees a quarantine only
  once every source rank said Quiesced (``refimpl.api.unrevocable.quarantine.quiesce``), not at the
  first rank's: a sibling's write may still be posted and land.
"""

from __future__ import annotations

import pytest
import torch

from refimpl.api import Receiver, Sender
from refimpl.api.tokens import write_kv_layer
from refimpl.api.wire import State, channels
from refimpl.errors import InUseError
from refimpl.testing.on_api.adapter import ApiAdapter
from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import (
    MODEL,
    Pair,
    geo,
    held,
    prefill,
    quarantined_under_pending_writes,
)
from tests.library.tours.tour_helpers import walks_to_early_ends


def test_the_tour_kills_a_sender_that_aborts_under_its_writes() -> None:
    """``quiesced_at_abort``: given the engine's abort while writes are in flight, the
    Sender ends at once (pins dropped, Quiesced on the wire) where the spec refuses
    ``PrefillTimeout`` (NoReuseUnderIO): the refinement map reads the Sender's phase, its
    source and the wire, and the walk stops there."""
    plan = plan_api(get_world("unrevocable_one"))
    res = run_api_tour(ApiAdapter(), plan, frozenset({"quiesced_at_abort"}))
    rep = api_report(plan, res)
    assert rep["sequences_diverged"] == 70 and rep["edges_covered"] == 399, rep  # measured
    assert all(k.startswith("state differs at ") and "ps" in k for k in rep["divergences"])
    first = str(res.failures[0][1])
    assert "given early, writes in flight" in first and "+Quiesced" in first
    assert "r0.ps: await_ack -> idle" in first


@pytest.mark.parametrize("mutants", [frozenset(), frozenset({"quiesced_at_abort"})])
def test_an_aborted_sender_says_quiesced_only_once_its_writes_landed(
    mutants: frozenset[str],
) -> None:
    """Through the public API, over ``InProcessTransport(revocable=False)`` whose last
    write is overtaken by the next message: the receiver gives up before any write
    landed (quarantined), then the engine's timeout aborts the Sender. It keeps its
    attempt and its pins while its writes are pending, and says Quiesced (its abort)
    once they landed. The bug switch ends at once: the source is unpinned under three
    pending writes, and its abort overtakes the last one, so the receiver frees the
    blocks that write still lands in."""
    t, p, ch, q = quarantined_under_pending_writes(mutants)
    assert list(q) == ["r"]
    p.tx.abort("r", "timeout")  # the engine's timer, the nack unread
    if mutants:
        assert p.tx.state("r") is State.ABORTED and p.tx.held() == {}
        assert t.writes_pending(ch, 1) == 3  # unpinned while three writes read the source
        msgs = [h["type"] for h, _ in t.poll(ch)]
        assert msgs == ["chunk", "chunk", "abort", "chunk"]  # Quiesced before a write
        return
    assert p.tx.state("r") is State.SENDING and list(p.tx.held()) == ["r"]
    assert t.writes_pending(ch, 1) == 3 and p.rx.quarantined() == q
    with pytest.raises(InUseError, match="its end waits for its writes: poll it"):
        p.tx.forget("r")
    p.tx.poll("r")  # the nack: still waiting
    assert p.tx.state("r") is State.SENDING and list(p.tx.held()) == ["r"]
    p.rx.poll("r")  # the writes land (the overtaken one last): recorded, not installed
    assert p.rx.quarantined() == q and t.writes_pending(ch, 1) == 0
    p.tx.poll("r")  # its writes are over: ended with the abort's reason, Quiesced
    assert p.tx.state("r") is State.ABORTED and p.tx.reasons("r") == ["timeout"]
    assert p.tx.held() == {} and p.rx.quarantined() == q  # the Quiesced is in flight
    p.rx.poll("r")
    assert p.rx.quarantined() == {} and p.rx.held() == {} and p.dst.alloc.num_free == 16


def test_an_abort_with_no_write_pending_ends_at_once() -> None:
    t = InProcessTransport(revocable=False)
    g = geo()
    ps, pd = g.make_pools(16), g.make_pools(16)
    p = Pair(t, ps, pd, Sender(ps, g, t, MODEL), Receiver(pd, g, t, MODEL))
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.tx.abort("r", "cancelled")  # offered only: nothing written
    assert p.tx.state("r") is State.ABORTED and p.tx.held() == {}


# ---------------------------------------------------------------- prefill TP 2
def _rank_senders(t: InProcessTransport) -> tuple[list[Sender], Receiver, list[list[int]]]:
    src, dst = geo(tp=2), geo()
    txs = [Sender(src.make_rank_pools(r, 8), src, t, MODEL, rank=r) for r in range(2)]
    blocks = []
    for r, tx in enumerate(txs):
        blocks.append(tx.pools.alloc.allocate("r", src.blocks_for(10)))
        kv = torch.randn(2, 2, src.kv_heads, 10, 8, generator=torch.Generator().manual_seed(r))
        h = src.kv_heads_per_rank
        for layer in range(2):
            part = [f[r * h : (r + 1) * h] for f in kv[layer]]
            write_kv_layer(tx.pools, "r", blocks[r], layer, part)
    return txs, Receiver(dst.make_pools(16), dst, t, MODEL), blocks


def test_a_quarantine_holds_until_every_prefill_rank_said_quiesced() -> None:
    """Two prefill ranks, each its own ``Sender(rank=r)``, streamed (layer by layer):
    rank 0's layers land, rank 1 has computed none yet; the receiver gives up (rank 1's
    chunks are still to come: quarantined) and nacks both. Rank 0, its writes over, says
    Quiesced; rank 1 has not read the nack and posts its layer 0. Main freed the blocks
    at rank 0's Quiesced, so that write landed in free blocks; now the quarantine holds
    until rank 1, its write landed, says it too."""
    t = InProcessTransport(revocable=False)
    txs, rx, blocks = _rank_senders(t)
    for r, tx in enumerate(txs):
        tx.offer("r", list(range(10)), blocks=blocks[r], layers=2, epoch=1)
    rx.poll("r")  # the manifests: reserved, ready to both ranks
    for tx in txs:
        tx.poll("r")
    for layer in range(2):
        txs[0].send_layer("r", layer)
    rx.poll("r")  # rank 0's layers and seal land
    rx.abort("r", "cancelled")  # rank 1's are still to come: quarantined
    q = rx.quarantined()
    assert list(q) == ["r"]
    txs[0].poll("r")  # nacked, its writes over: Quiesced (rank 0)
    assert txs[0].state("r") is State.ABORTED and txs[0].held() == {}
    rx.poll("r")
    assert rx.quarantined() == q, "freed at rank 0's Quiesced: rank 1 still writes"
    txs[1].send_layer("r", 0)  # the engine's layer 0, the nack unread: a write posted
    ch = channels("r").to_receiver
    assert t.writes_pending(ch, 1) == 1
    txs[1].poll("r")  # nacked, a write pending: it waits
    assert txs[1].state("r") is State.SENDING
    rx.poll("r")  # the write lands in the quarantined blocks: recorded, not installed
    assert rx.quarantined() == q
    txs[1].poll("r")  # Quiesced (rank 1)
    assert txs[1].state("r") is State.ABORTED and txs[1].held() == {}
    rx.poll("r")
    assert rx.quarantined() == {} and rx.held() == {} and held(rx.pools) == {}


def test_the_unrevocable_tp2_worlds_nacks_and_timeouts_under_writes_per_rank() -> None:
    """unrevocable_tp2_one on one ``Sender(rank=r)`` per prefill rank, the edge walks that
    resume after a Nack or time out, to that step (``walks_to_early_ends``: 116 walks,
    1,202 of the 4,763 steps): the Nacks and aborts handed to both ranks' Senders while
    writes are in flight (measured: 22 and 207). Every edge: nightly, below."""
    plan = walks_to_early_ends(plan_api(get_world("unrevocable_tp2_one")))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert not res.failures, str(res.failures[0][1])[:2000]
    assert res.sequences == 116 and res.probes > 0
    assert (rep["early_nacks"], rep["early_aborts"]) == (22, 207), rep


@pytest.mark.nightly
def test_every_edge_of_the_unrevocable_tp2_world_on_one_sender_per_rank() -> None:
    """unrevocable_tp2_one (prefill TP 2, no revoke): every closed edge on one
    ``Sender(rank=r)`` per prefill rank, whose Quiesced the Receiver needs from both. The
    spec's prefill is one worker (its Quiesced covers every rank's writes, and the
    tour's transport counts them together), so the tour cannot show one rank quiescing
    under a sibling's write: ``test_a_quarantine_holds_until_every_prefill_rank_said_
    quiesced`` does; here a Receiver that never heard a rank would hold the quarantine
    past ``DecodeReclaim`` and diverge."""
    plan = plan_api(get_world("unrevocable_tp2_one"))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == (1276, 1276), rep  # measured
    assert not res.failures, str(res.failures[0][1])[:2000]
    assert (rep["early_nacks"], rep["early_aborts"]) == (76, 479), rep


def test_a_sibling_rank_that_hears_an_abort_waits_for_its_writes_too() -> None:
    """Rank 0 aborts while both ranks' writes are pending: rank 1 hears it at once and
    stops, but keeps its attempt (and the copies its writes read) until they landed,
    then ends with rank 0's reason and says its own Quiesced; the Receiver frees once
    both said it."""
    t = InProcessTransport(revocable=False)
    txs, rx, blocks = _rank_senders(t)
    for r, tx in enumerate(txs):
        tx.offer("r", list(range(10)), blocks=blocks[r], layers=2, epoch=1)
    rx.poll("r")
    for tx in txs:
        tx.poll("r")
        tx.send_layer("r", 0)  # layer 1 never computed: the attempt cannot complete
    txs[0].abort("r", "the router cancelled")
    txs[1].poll("r")  # hears it, its write still pending: it waits
    assert [tx.state("r") for tx in txs] == [State.SENDING, State.SENDING]
    rx.poll("r")  # the writes land (a streamed offer's writes read its copies, not pins)
    for tx in txs:
        tx.poll("r")  # over: each ends and says Quiesced
    assert all(tx.state("r") is State.ABORTED and tx.held() == {} for tx in txs)
    assert all("rank 0 aborted: the router cancelled" in tx.reasons("r")[0] for tx in txs)
    rx.poll("r")
    assert rx.state("r").final and rx.quarantined() == {} and held(rx.pools) == {}
