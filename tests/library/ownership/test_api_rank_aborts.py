"""Any rank's end reaches every rank of both sides at once, with its reason (issue #30
bug 3), where main's ranks reached nobody: a prefill rank cancelled before its offer, a
prefill rank whose offer fails (refused by its own checks), a
decode rank cancelled before its part of the attempt arrived (told through the router's
``Epochs``, or without it when its manifest comes). Every rank ends ABORTED with that
rank's reason, no rank by its own timer, and 0 blocks held. In process; the kill of a
rank's process is ``test_api_rank_group_dist.py``."""

from __future__ import annotations

import pytest

from refimpl import State
from refimpl.api.ranks import RankReceiver
from refimpl.errors import ChunkError
from tests.library.lib_helpers import MODEL
from tests.library.ownership.test_api_ranks import RID, Group, N


def _start(g: Group) -> None:
    g.epochs.open(RID)
    for rx in g.rx:
        rx.expect(RID, decode_room=2)


def _all_end_with(g: Group, reason: str) -> None:
    for x in [*g.tx, *g.rx]:
        assert x.state(RID) is State.ABORTED, (x, x.state(RID), x.reasons(RID))
        assert any(reason in r for r in x.reasons(RID)), (x, x.reasons(RID))
    assert g.leftover() == [] and all(not rx.held() for rx in g.rx)
    assert all(not tx.held() for tx in g.tx)


def test_a_prefill_rank_cancelled_before_its_offer_ends_every_rank() -> None:
    g = Group(2, 2)
    _start(g)
    g.tx[1].abort(RID, "the router cancelled")  # before it offered
    g.tx[0].offer(RID, list(range(N)), blocks=g.blocks[0])
    g.poll()
    _all_end_with(g, "prefill rank 1 aborted: the router cancelled")
    assert g.tx[1].offer(RID, list(range(N)), blocks=g.blocks[1]) == 1  # the late offer
    assert g.tx[1].state(RID) is State.ABORTED and g.tx[1].stats(RID) == {1: (0, 0)}


def test_a_sibling_abort_heard_before_the_offer_ends_the_attempt_there_too() -> None:
    g = Group(2, 2)
    _start(g)
    g.tx[0].offer(RID, list(range(N)), blocks=g.blocks[0])
    g.tx[0].abort(RID, "the router cancelled")
    g.poll()  # prefill rank 1 has not offered: it hears the abort all the same
    g.tx[1].offer(RID, list(range(N)), blocks=g.blocks[1])
    g.poll()
    _all_end_with(g, "prefill rank 0 aborted: the router cancelled")
    assert g.tx[1].stats(RID) == {1: (0, 0)}  # nothing left prefill rank 1


def test_an_offer_that_fails_ends_every_rank_with_its_error() -> None:
    g = Group(2, 4)  # prefill rank 1 offers to decode ranks 2 and 3
    _start(g)
    g.tx[0].offer(RID, list(range(N)), blocks=g.blocks[0])
    with pytest.raises(ChunkError, match="1 blocks for 11 tokens"):
        g.tx[1].offer(RID, list(range(N)), blocks=g.blocks[1][:1])  # too few blocks
    g.poll()
    _all_end_with(g, "prefill rank 1's offer at epoch 1 failed")


@pytest.mark.parametrize("told", ["epochs", "manifest"])
def test_a_decode_rank_cancelled_before_its_part_arrived_ends_every_rank(told: str) -> None:
    g = Group(2, 2)
    if told == "epochs":  # it reads the router's store: the attempt ends now, everywhere
        g.rx[1] = RankReceiver(g.dp[1], g.dst, g.t, MODEL, rank=1, src_tp=2, epochs=g.epochs)
    _start(g)
    g.rx[1].abort(RID, "the scheduler cancelled")  # nothing of the attempt here yet
    if told == "epochs":
        g.poll()
        assert all(x.state(RID) is State.ABORTED for x in [g.rx[0]]), g.rx[0].reasons(RID)
    for r, tx in enumerate(g.tx):
        tx.offer(RID, list(range(N)), blocks=g.blocks[r])
    g.poll()
    _all_end_with(g, "decode rank 1 aborted: the scheduler cancelled")
