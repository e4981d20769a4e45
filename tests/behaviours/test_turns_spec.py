"""Multi-turn append on decode (spec/behaviours/turns.py): guards, a two-turn walk that
keeps every property, the pin against the freeing actions, and the four mutants."""

from __future__ import annotations

from typing import Any

import pytest

from model_checks.explicit.runner import check_config, check_mutant
from spec.actions import apply
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import CANCELLED, NONE, PREEMPTED, RUNNING, World
from tests.spec.spec_helpers import HO, R, W, check_guard

TU = CONFIGS["turns_append"]
DECODING = R(st=RUNNING, d=4, ep=1, dep=1, landed=1, rmask=1)  # d writable: turn 1 decodes
IDLE_T = DECODING._replace(ti=1)  # turn 1 ended, the session's KV kept on decode
ROUTED = IDLE_T._replace(tn=1, tc=1)  # turn 2 routed to decode: the session pinned
APPENDING = ROUTED._replace(tn=2)

# (action, config, state, request, message, expected): as tests/spec/test_guards_decode.py
CASES: list[tuple[str, Any, World, int, int, Any]] = [
    ("TurnEnd", TU, W(DECODING), 0, 0, {"ti": 1}),
    ("TurnEnd", HO, W(DECODING), 0, 0, ("disabled", None)),  # turns off
    ("TurnEnd", TU, W(DECODING._replace(tc=1)), 0, 0, ("disabled", None)),  # last turn
    ("TurnEdit", TU, W(IDLE_T), 0, 0, {"tdv": 1}),
    ("TurnEdit", TU, W(DECODING), 0, 0, ("disabled", None)),  # not between turns
    ("TurnRoute", TU, W(IDLE_T), 0, 0, {"tn": 1, "tc": 1}),
    ("TurnRoute", TU, W(DECODING), 0, 0, ("refused", "SingleWriter")),  # turn 1 decodes
    ("TurnRoute", TU, W(IDLE_T._replace(st=PREEMPTED, d=NONE)), 0, 0, ("refused", "NothingLost")),
    ("TurnRoute", TU, W(ROUTED), 0, 0, ("disabled", None)),  # routed already
    ("TurnPrefill", TU, W(IDLE_T._replace(tdv=1)), 0, 0, {"st": PREEMPTED, "d": NONE, "ti": 0}),
    ("TurnPrefill", TU, W(IDLE_T._replace(st=PREEMPTED, d=NONE)), 0, 0, {"ti": 0, "tc": 1}),
    ("TurnPrefill", TU, W(IDLE_T), 0, 0, ("disabled", None)),  # decode holds it, no divergence
    ("DecodeTurnCut", TU, W(ROUTED._replace(tdv=1)), 0, 0, {"tdv": 0}),
    ("DecodeTurnCut", TU, W(ROUTED), 0, 0, ("disabled", None)),  # nothing to cut
    ("DecodeAppend", TU, W(ROUTED), 0, 0, {"tn": 2}),
    ("DecodeAppend", TU, W(ROUTED._replace(tdv=1)), 0, 0, ("refused", "ContentIdentity")),
    ("DecodeAppend", TU, W(ROUTED._replace(st=CANCELLED)), 0, 0, {"tn": 0, "ti": 0}),
    ("DecodeAppend", TU, W(IDLE_T), 0, 0, ("disabled", None)),  # not routed
    ("DecodeAppendCommit", TU, W(APPENDING), 0, 0, {"tn": 0, "ti": 0}),
    ("DecodeAppendCommit", TU, W(ROUTED), 0, 0, ("disabled", None)),
    ("SessionEvict", TU, W(IDLE_T), 0, 0, {"st": PREEMPTED, "d": NONE, "ti": 1}),
    ("SessionEvict", TU, W(ROUTED), 0, 0, ("refused", "NothingLost")),  # pinned
    ("SessionEvict", TU, W(DECODING), 0, 0, ("disabled", None)),  # the turn still decodes
]


@pytest.mark.parametrize("name,c,w,i,arg,expected", CASES)
def test_guard(name, c, w, i, arg, expected):  # type: ignore[no-untyped-def]
    check_guard(name, c, w, i, arg, expected)


def _go(w: World, name: str) -> World:
    s = apply(w, TU, frozenset(), name, 0, 0)
    assert isinstance(s, World), (name, s)
    assert violated_safety(s, TU) == []
    return s


def test_two_turns_divergent_tail_cut_then_appended() -> None:
    w = W(DECODING)
    for name in ("TurnEnd", "TurnEdit", "TurnRoute", "DecodeTurnCut", "DecodeAppend"):
        w = _go(w, name)
    assert w.reqs[0].tn == 2 and w.reqs[0].tdv == 0
    w = _go(w, "DecodeAppendCommit")
    assert (w.reqs[0].tn, w.reqs[0].ti, w.reqs[0].tc) == (0, 0, 1)
    assert w.reqs[0].d == 4 and w.reqs[0].st == RUNNING  # turn 2 decodes on the session's KV
    _go(w, "DecodeFinish")


@pytest.mark.parametrize("name", ["DecodeFinish", "DecodeAbort", "DecodeStep"])
def test_nothing_frees_or_steps_a_pinned_session(name: str) -> None:
    for r in (ROUTED, APPENDING, ROUTED._replace(st=CANCELLED)):
        s = apply(W(r), TU, frozenset(), name, 0, 0)
        assert not isinstance(s, World) or s.reqs[0].d == 4, (name, r)


def test_eviction_between_turns_goes_back_to_prefill() -> None:
    w = _go(_go(W(DECODING), "TurnEnd"), "SessionEvict")
    assert not isinstance(apply(w, TU, frozenset(), "TurnRoute", 0, 0), World)
    assert not isinstance(apply(w, TU, frozenset(), "PrefillAdmit", 0, 0), World)  # turn first
    w = _go(w, "TurnPrefill")
    assert w.reqs[0].st == PREEMPTED and w.reqs[0].ti == 0
    w = _go(w, "PrefillAdmit")  # the whole conversation is computed again


def test_turns_append_holds_and_reaches_every_turn_action() -> None:
    r = check_config("turns_append")
    assert not r.violations
    names = {lab[0] for lab in r.graph.lab}
    turn_actions = {"TurnEnd", "TurnEdit", "TurnRoute", "TurnPrefill", "DecodeTurnCut"}
    assert turn_actions | {"DecodeAppend", "DecodeAppendCommit", "SessionEvict"} <= names


@pytest.mark.parametrize(
    "name,prop",
    [
        ("append_after_evict", "NothingLost"),
        ("append_divergent_uncut", "ContentIdentity"),
        ("two_writers_on_session", "SingleWriter"),
        ("evict_pinned_session", "NothingLost"),
    ],
)
def test_mutant_caught(name: str, prop: str) -> None:
    r = check_mutant(name)
    assert r.caught and r.expected == prop
