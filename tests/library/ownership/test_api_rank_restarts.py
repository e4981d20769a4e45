"""Ranks agree across a restart (issue #30 bug 4, "What to build" 4), in one process:
``RankSender``/``RankReceiver`` carry their incarnation. A prefill rank that restarts
mid-attempt and is told to offer again never joins its dead incarnation's attempt (the
store records who offered which epoch, ``Epochs.claim``): every rank of both sides ends
it at once, naming the rank, its incarnations and the epoch, 0 blocks held, and the
router's retry lands bit-exact. A stall that ends by an engine's timer names the epoch
and the ranks it waited on, never a bare timeout. A dead incarnation's group message is
refused by name; the engine's membership (``peer_restarted``) ends a live attempt the
restarted rank took part in. Main stalled in each case until every rank's own timer."""

from __future__ import annotations

import pytest
import torch

from refimpl import State, read_kv
from refimpl.api.ranks import Epochs, RankSender, group_channel
from tests.library.lib_helpers import MODEL
from tests.library.ownership.test_api_ranks import RID, Group, N


def _restart_prefill_rank_1(g: Group, incarnation: int) -> None:
    """Prefill rank 1's process comes back: empty pools, no records, the same store."""
    g.sp[1] = g.src.make_rank_pools(1, 16)
    g.tx[1] = RankSender(g.sp[1], g.src, g.t, MODEL, rank=1, dst_tp=len(g.rx),
                         epochs=Epochs(g.epochs.store), incarnation=incarnation)  # fmt: skip
    g.blocks[1] = g.sp[1].alloc.allocate(RID, g.src.blocks_for(N))


def _ends_by_name(g: Group, *words: str) -> None:
    for x in [*g.tx, *g.rx]:
        assert x.state(RID) is State.ABORTED, (x, x.state(RID), x.reasons(RID))
        assert all(w in " ".join(x.reasons(RID)) for w in words), (x, x.reasons(RID))
    assert g.leftover() == [] and all(not rx.held() for rx in g.rx)


def test_a_rank_restarted_mid_attempt_ends_it_on_every_rank_then_the_retry_lands() -> None:
    g = Group(2, 2)
    g.run(upto=1)  # layer 0 out on both ranks; then prefill rank 1's process dies
    _restart_prefill_rank_1(g, incarnation=1)
    assert g.tx[1].offer(RID, list(range(N)), blocks=g.blocks[1]) == 1  # told to offer again
    for layer in range(3):
        g.write(layer)
        for r, tx in enumerate(g.tx):
            if r == 1 or layer > 0:
                tx.send_layer(RID, layer)
    g.poll()  # no timer fires: main stalled here (every rank SENDING/RECEIVING)
    _ends_by_name(g, "[RankAgreement]", "prefill rank 1 restarted", "incarnation 0 -> 1", "epoch 1")
    for x in [*g.tx, *g.rx]:
        x.forget(RID)
    g.run()  # the router opens the retry (epoch 2): every rank offers it, it lands
    h = g.dst.kv_heads_per_rank
    for d, (rx, p) in enumerate(zip(g.rx, g.dp, strict=True)):
        assert rx.ready(RID), rx.reasons(RID)
        assert torch.equal(read_kv(p, rx.blocks(RID), N), g.kv[:, :, d * h : (d + 1) * h])


def test_a_rank_restarted_with_the_same_incarnation_would_stall_so_it_must_be_told() -> None:
    """What the incarnation buys: told nothing (0 again), nothing can tell the two apart
    and the attempt stalls until a timer, whose reason then names what it waits for."""
    g = Group(2, 2)
    g.run(upto=1)
    _restart_prefill_rank_1(g, incarnation=0)
    g.tx[1].offer(RID, list(range(N)), blocks=g.blocks[1])
    g.poll()
    assert all(not x.state(RID).final for x in [*g.tx, *g.rx])
    g.rx[0].abort(RID, "timeout")  # decode rank 0's timer
    g.poll()
    _ends_by_name(g, "decode rank 0 aborted: timeout", "epoch 1", "decode rank 1's install")


def test_a_stall_ends_by_a_timer_naming_the_epoch_and_the_ranks_it_waited_on() -> None:
    g = Group(2, 2)
    g.epochs.open(RID)
    for rx in g.rx:
        rx.expect(RID, decode_room=2)
    g.tx[0].offer(RID, list(range(N)), blocks=g.blocks[0])  # prefill rank 1 hangs: no offer
    g.write(0)
    g.tx[0].send_layer(RID, 0)
    g.poll()
    g.rx[0].abort(RID, "timeout")  # decode rank 0's timer fires first
    g.poll()
    _ends_by_name(
        g, "decode rank 0 aborted: timeout", "epoch 1", "prefill rank 1's offer at epoch 1"
    )
    assert "prefill rank 0's offer" not in g.rx[0].reasons(RID)[0]  # that one was heard


def test_a_dead_incarnations_group_message_is_refused_by_name() -> None:
    g = Group(2, 2)
    g.run(upto=1)
    g.tx[0].peer_restarted("p", 1, 1)  # the membership: prefill rank 1 came back as 1
    g.poll()
    _ends_by_name(g, "prefill rank 1 restarted (incarnation 0 -> 1)", "epoch 1")
    for x in [g.tx[0], *g.rx]:
        x.forget(RID)
    late = {"type": "abort", "epoch": 2, "reasons": ["zombie"], "from": "prefill rank 1"}
    g.t.send(group_channel(RID, "p", 0), late)  # incarnation 0's, after the restart
    _restart_prefill_rank_1(g, incarnation=1)
    for rx in g.rx:
        rx.peer_restarted("p", 1, 1)
    g.run()  # the retry at epoch 2: the zombie's abort changes nothing
    assert all(rx.ready(RID) for rx in g.rx) and g.tx[0].state(RID) is State.DONE
    assert any("[Fencing]" in s and "incarnation 0" in s for s in g.tx[0].stale())


def test_peer_restarted_names_a_rank_of_the_group() -> None:
    g = Group(2, 2)
    with pytest.raises(ValueError, match="not another rank"):
        g.tx[0].peer_restarted("p", 0, 1)
    with pytest.raises(ValueError, match="not another rank"):
        g.rx[0].peer_restarted("d", 2, 1)
    with pytest.raises(ValueError, match="incarnation"):
        g.rx[0].peer_restarted("p", 1, -1)
    with pytest.raises(ValueError, match="incarnation"):
        RankSender(g.sp[0], g.src, g.t, MODEL, rank=0, dst_tp=2, epochs=g.epochs, incarnation=-1)


def test_forget_drops_the_ranks_claim_from_the_store() -> None:
    g = Group(2, 2)
    g.run()
    keys = g.epochs.store.num_keys()
    for x in [*g.tx, *g.rx]:
        x.forget(RID)
    assert g.epochs.store.num_keys() == keys - 2  # each prefill rank's claim; the counter stays


def test_a_dead_prefill_incarnations_manifest_is_refused_by_every_decode_rank() -> None:
    """Every prefill rank offers, then the prefill worker dies with its manifests still
    on the wire and comes back as incarnation 1; the membership tells the decode ranks.
    Each decode rank refuses the dead incarnation's manifest by name and reserves
    nothing (before, the sub-handoffs stamped no incarnation and their Receivers heard
    no restart: each decode rank took the dead manifest and reserved its blocks)."""
    g = Group(2, 2)
    g.epochs.open(RID)
    for rx in g.rx:
        rx.expect(RID, decode_room=2)
    for r, tx in enumerate(g.tx):
        tx.offer(RID, list(range(N)), blocks=g.blocks[r])
    for r in range(2):  # the prefill worker's restart: every rank, new pools, incarnation 1
        g.sp[r] = g.src.make_rank_pools(r, 16)
        g.tx[r] = RankSender(g.sp[r], g.src, g.t, MODEL, rank=r, dst_tp=2,
                             epochs=Epochs(g.epochs.store), incarnation=1)  # fmt: skip
        for rx in g.rx:
            rx.peer_restarted("p", r, 1)
    for rx in g.rx:
        rx.poll(RID)
        assert rx.state(RID) is State.WAITING, (rx.state(RID), rx.reasons(RID))
        assert any("[Fencing]" in s and "manifest" in s for s in rx.stale()), rx.stale()
    assert g.leftover() == [] and not any(rx.held() for rx in g.rx)


def test_a_decode_rank_hearing_two_prefill_ranks_fences_each_by_its_own_incarnation() -> None:
    """Prefill TP 2 -> decode TP 1: the one decode rank hears both prefill ranks. Rank 1
    restarts (incarnation 1), rank 0 does not: the retry lands bit-exact, the decode
    rank taking rank 1's seal at incarnation 1, then rank 0's at 0 (one peer
    incarnation for both, as a Receiver's, would refuse rank 0's seal as a dead
    incarnation's once rank 1's newer one spoke: the retry would stall)."""
    g = Group(2, 1, dst_bs=8)
    g.run(upto=1)
    _restart_prefill_rank_1(g, incarnation=1)
    g.rx[0].peer_restarted("p", 1, 1)
    g.tx[0].peer_restarted("p", 1, 1)  # a sibling of its own side: the attempt ends
    g.poll()
    assert all(x.state(RID).final for x in [g.tx[0], *g.rx])
    for x in [*g.tx, *g.rx]:
        x.forget(RID)
    g.epochs.open(RID)  # the router's retry (epoch 2); rank 1 (restarted) sends first
    g.rx[0].expect(RID, decode_room=2)
    for r in (1, 0):
        g.tx[r].offer(RID, list(range(N)), blocks=g.blocks[r])
    g.poll(2)
    for r in (1, 0):
        for layer in range(3):
            g.write(layer)
            g.tx[r].send_layer(RID, layer)
        g.poll(2)
    g.poll()  # the router's retry (epoch 2)
    assert g.rx[0].ready(RID), g.rx[0].reasons(RID)
    assert torch.equal(read_kv(g.dp[0], g.rx[0].blocks(RID), N), g.kv)
    assert not any("[Fencing]" in s for s in g.rx[0].stale()), g.rx[0].stale()
