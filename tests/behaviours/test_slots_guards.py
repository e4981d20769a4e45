"""Metadata slots (spec/behaviours/slots.py): one slot on decode, reused; a late
notification is matched by its room, never by the slot alone."""

from __future__ import annotations

from spec.actions import apply
from spec.common import Refused
from spec.config import CONFIGS
from spec.state import (
    AWAIT_ACK,
    CANCELLED,
    COMPLETE,
    FILLING,
    M_DONE,
    M_HANDOFF,
    NONE,
    RESERVED,
    RUNNING,
    World,
    msg,
)
from spec.steps import check_step
from tests.spec.spec_helpers import R, W, check_guard

SL = CONFIGS["slots_two"]  # two requests, 1 block, cap_d=2, one metadata slot
FROZEN = R(st=RUNNING, p=COMPLETE, ep=1, ps=1, net=(msg(M_HANDOFF, 1),))
# r0 ended and was freed on decode while its RankDone is still in flight
LATE = R(st=CANCELLED, ep=1, dep=1, ps=AWAIT_ACK, p=COMPLETE, net=(msg(M_DONE, 1, 0),))
HOLDER = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=FILLING, landed=1, sl=1, ps=AWAIT_ACK)

CASES = [
    ("DecodeReserve", SL, W(FROZEN, R()), 0, msg(M_HANDOFF, 1), {"d": RESERVED, "sl": 1}),
    (
        "DecodeReserve",
        SL,
        W(FROZEN, R(st=RUNNING, d=RESERVED, dep=1, sl=1)),
        0,
        msg(M_HANDOFF, 1),
        ("refused", "CapacityRefcount"),
    ),
]


def test_guards() -> None:
    for row in CASES:
        check_guard(*row)


def test_reject_when_the_slot_is_held() -> None:
    w = W(FROZEN, R(st=RUNNING, d=RESERVED, dep=1, sl=1))
    s = apply(w, SL, frozenset(), "DecodeReject", 0, msg(M_HANDOFF, 1))
    assert isinstance(s, World) and s.reqs[0].dep == 1 and s.reqs[0].d == NONE


def test_free_returns_the_slot() -> None:
    w = W(R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=COMPLETE, landed=1, rmask=1, sl=1), R())
    s = apply(w, SL, frozenset(), "DecodeCommit", 0, 0)
    assert isinstance(s, World)
    f = apply(s, SL, frozenset(), "DecodeFinish", 0, 0)
    assert isinstance(f, World) and f.reqs[0].sl == 0


def test_late_notification_is_discarded_by_room() -> None:
    w = W(LATE, HOLDER)
    code = msg(M_DONE, 1, 0)
    assert isinstance(apply(w, SL, frozenset(), "DecodeReceiveDone", 0, code), Refused)
    s = apply(w, SL, frozenset(), "DecodeDiscard", 0, code)
    assert isinstance(s, World) and s.reqs[1] == HOLDER


def test_slot_reused_unfenced_counts_it_for_the_new_holder() -> None:
    w = W(LATE, HOLDER)
    code = msg(M_DONE, 1, 0)
    s = apply(w, SL, frozenset({"slot_reused_unfenced"}), "DecodeReceiveDone", 0, code)
    assert isinstance(s, World) and s.reqs[1].rmask == 1 and s.reqs[0].net == ()
    assert "Fencing" in check_step(w, "DecodeReceiveDone", 0, code, s, SL)


def test_no_slot_without_the_switch() -> None:
    ho = CONFIGS["handoff_two"]
    s = apply(W(FROZEN, R()), ho, frozenset(), "DecodeReserve", 0, msg(M_HANDOFF, 1))
    assert isinstance(s, World) and s.reqs[0].sl == 0
