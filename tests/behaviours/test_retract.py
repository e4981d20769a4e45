"""Retraction and refetch (spec/behaviours/retract.py): guards, the refetch's new epoch,
the late messages of the retracted attempt fenced, and the two mutants."""

from __future__ import annotations

from typing import Any

import pytest

from model_checks.explicit.runner import check_config, check_mutant
from spec.actions import apply
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    FAILED,
    IDLE,
    M_ACK,
    M_HANDOFF,
    M_READY,
    NONE,
    PREEMPTED,
    PREFILLING,
    RUNNING,
    WRITABLE,
    World,
    msg,
)
from tests.spec.spec_helpers import HO, R, W, check_guard

RT = CONFIGS["handoff_retract"]
COMMITTED = R(st=RUNNING, d=WRITABLE, ep=1, dep=1, landed=1, rmask=1)

# (action, config, state, request, message, expected): as tests/spec/test_guards_decode.py
CASES: list[tuple[str, Any, World, int, int, Any]] = [
    ("DecodeRetract", RT, W(COMMITTED), 0, 0, {"st": PREEMPTED, "d": NONE, "mv": 1, "dep": 1}),
    ("DecodeRetract", HO, W(COMMITTED), 0, 0, ("disabled", None)),  # retract off
    # prefill down: nothing can compute it again, the request fails (pair_crash_retract)
    ("DecodeRetract", RT, W(COMMITTED, p_up=False), 0, 0, {"st": FAILED, "d": NONE, "mv": 1}),
    ("DecodeRetract", RT, W(COMMITTED._replace(mv=1)), 0, 0, ("disabled", None)),  # moved
    ("DecodeRetract", RT, W(COMMITTED._replace(d=COMPLETE)), 0, 0, ("disabled", None)),
]


@pytest.mark.parametrize("name,c,w,i,arg,expected", CASES)
def test_guard(name, c, w, i, arg, expected):  # type: ignore[no-untyped-def]
    check_guard(name, c, w, i, arg, expected)


def _go(w: World, name: str, arg: int = 0) -> World:
    s = apply(w, RT, frozenset(), name, 0, arg)
    assert isinstance(s, World), (name, s)
    assert violated_safety(s, RT) == []
    return s


def test_refetch_is_a_new_epoch_and_fences_the_first() -> None:
    # decode committed attempt 1, prefill still holds its source (the Ack in flight)
    w = W(
        R(
            st=RUNNING,
            p=COMPLETE,
            ps=AWAIT_ACK,
            ep=1,
            dep=1,
            d=WRITABLE,
            landed=1,
            rmask=1,
            sent=2,
            net=(msg(M_ACK, 1), msg(M_READY, 1)),
        )
    )
    w = _go(w, "DecodeRetract")
    assert w.reqs[0].st == PREEMPTED and w.reqs[0].p == COMPLETE  # nothing lost: recompute
    w = _go(w, "PrefillRelease", msg(M_ACK, 1))  # the Ack still frees the old source
    w = _go(w, "PrefillAdmit")
    assert w.reqs[0].st == PREFILLING
    w = _go(_go(w, "PrefillRun"), "PrefillFreeze")
    r = w.reqs[0]
    assert r.ep == 2 and r.ps == AWAIT_READY and msg(M_HANDOFF, 2) in r.net
    # the late Ready of attempt 1 is fenced at prefill; decode takes the new attempt
    late = apply(w, RT, frozenset(), "PrefillRecvReady", 0, msg(M_READY, 1))
    assert isinstance(late, Refused) and late.prop == "Fencing"
    w = _go(w, "DecodeReserve", msg(M_HANDOFF, 2))
    assert w.reqs[0].dep == 2
    w = _go(w, "PrefillRecvReady", msg(M_READY, 2))
    assert w.reqs[0].ps != IDLE


def test_retract_world_holds_and_reaches_the_refetch() -> None:
    res = check_config("handoff_retract")
    assert not res.violations
    assert res.graph.n_states > 1000


@pytest.mark.parametrize(
    "name,prop", [("retract_loses_kv", "NothingLost"), ("retract_keeps_epoch", "NoReuseUnderIO")]
)
def test_mutant_caught(name: str, prop: str) -> None:
    res = check_mutant(name)
    assert res.caught and res.expected == prop


def test_loses_kv_leaves_a_running_request_without_kv() -> None:
    s = apply(W(COMMITTED), RT, frozenset({"retract_loses_kv"}), "DecodeRetract", 0, 0)
    assert isinstance(s, World)
    assert "NothingLost" in violated_safety(s, RT)
