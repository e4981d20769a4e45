"""Multi-turn append on decode (issue #22 item 5), every layer: the spec's guards and a
two-turn walk (spec/behaviours/turns.py); the reference engine refines every turn edge of
turns_append on a deterministic tour, and each mutant's counterexample replays on it with
the bug and is refused without it (refimpl/engine/behaviours/turns.py); the two-turn PPD
path of `kvown demo` is bit-exact against the unbroken run (refimpl/demo/turns.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from model_checks.explicit.runner import check_config, check_mutant
from refimpl.demo.paths import DEMO_CONFIG
from refimpl.demo.turns import TURN_PATHS, run_turns
from refimpl.engine.behaviours.turns import common_prefix
from refimpl.engine.core import Engine
from refimpl.errors import OwnershipError
from refimpl.model import ContiguousKV, PagedKV
from spec.actions import ACTIONS, apply, encode_args
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import CANCELLED, FAILED, NONE, PREEMPTED, RUNNING, World
from spec.state import G_END_FAILED as G_FAILED
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
    # prefill down: nothing can compute the next turn, it fails (pair_crash_turns)
    ("SessionEvict", TU, W(IDLE_T, p_up=False), 0, 0, {"st": FAILED, "d": NONE, "g": G_FAILED}),
    ("TurnPrefill", TU, W(IDLE_T._replace(tdv=1), p_up=False), 0, 0, {"st": FAILED, "tc": 1}),
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


TU = CONFIGS["turns_append"]
TURN_ACTIONS = {n for n, a in ACTIONS.items() if a.fn.__module__ == "spec.behaviours.turns"}


def _tour_paths() -> list[list[tuple[str, int, int]]]:
    """For every turn action, a shortest path of turns_append ending with each of its
    edges' first occurrence per source depth (deterministic: BFS order)."""
    g = check_config("turns_append", liveness=False).graph
    seen: set[tuple[str, int]] = set()
    paths = []
    for k, (name, _i, _arg) in enumerate(g.lab):
        key = (name, g.depth[g.src[k]])
        if name in TURN_ACTIONS and key not in seen:
            seen.add(key)
            paths.append(g.step_path(k))
    return paths


def test_the_engine_refines_every_turn_edge_and_refusal() -> None:
    """Each path replays on the engine, abstract() equals the spec's successor after every
    step, and at every state each turn action the spec refuses with a property the
    engine refuses with the same one, changing nothing."""
    paths = _tour_paths()
    assert {p[-1][0] for p in paths} == TURN_ACTIONS
    refused: set[str] = set()
    for path in paths:
        e, w = Engine(TU, seed=0), TU.initial()
        for name, i, arg in path:
            for t in sorted(TURN_ACTIONS):
                why = apply(w, TU, frozenset(), t, 0, 0)
                if isinstance(why, Refused) and why.prop:
                    before = e.fingerprint()
                    with pytest.raises(OwnershipError) as err:
                        e.step(t, {"req": 0})
                    assert err.value.prop == why.prop and e.fingerprint() == before
                    refused.add(why.prop)
            want = apply(w, TU, frozenset(), name, i, arg)
            assert isinstance(want, World)
            e.step(name, encode_args(name, i, arg))
            assert e.abstract() == want, (path, name)
            e.check_integrity()
            w = want
    assert refused == {"ContentIdentity", "NothingLost", "SingleWriter"}


@pytest.mark.parametrize(
    "name",
    [
        "append_after_evict",
        "append_divergent_uncut",
        "two_writers_on_session",
        "evict_pinned_session",
    ],
)
def test_mutant_counterexample_on_the_engine(name: str) -> None:
    r = check_mutant(name)
    assert r.trace is not None
    bad = Engine(TU, seed=0, mutants=frozenset({name}))
    bad.replay(r.trace.steps)
    assert r.expected in violated_safety(bad.abstract(), TU)
    good = Engine(TU, seed=0)
    with pytest.raises(OwnershipError):
        good.replay(r.trace.steps)


def test_cut_then_append_from_the_common_prefix() -> None:
    e = Engine(TU, seed=0)
    for name in ("PrefillAdmit", "PrefillRun", "PrefillFreeze"):
        e.step(name, {"req": 0})
    e.step("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})
    e.step("PrefillRecvReady", {"req": 0, "msg": "Ready", "epoch": 1, "idx": 0})
    e.step("PrefillSendChunk", {"req": 0})
    e.step("PrefillSendChunk", {"req": 0})
    e.step("DecodeReceiveChunk", {"req": 0, "msg": "Chunk", "epoch": 1, "idx": 0})
    e.step("DecodeReceiveDone", {"req": 0, "msg": "RankDone", "epoch": 1, "idx": 0})
    e.step("DecodeValidate", {"req": 0})
    e.step("DecodeCommit", {"req": 0})
    e.step("PrefillRelease", {"req": 0, "msg": "Ack", "epoch": 1, "idx": 0})
    for name in ("TurnEnd", "TurnEdit", "TurnRoute"):
        e.step(name, {"req": 0})
    t = e.turns[0]
    assert t.prompt is not None
    lcp = common_prefix(t.kv, t.prompt)
    assert 0 < lcp < len(t.kv)
    with pytest.raises(OwnershipError, match="tail"):
        e.step("DecodeAppend", {"req": 0})
    with pytest.raises(OwnershipError):
        e.step("SessionEvict", {"req": 0})  # pinned
    e.step("DecodeTurnCut", {"req": 0})
    assert len(t.kv) == lcp
    e.step("DecodeAppend", {"req": 0})
    e.step("DecodeAppendCommit", {"req": 0})
    assert t.kv == t.prompt and violated_safety(e.abstract(), TU) == []


DEMO_STEPS = 2


@pytest.mark.parametrize("divergent", [False, True])
def test_two_turns_bit_exact(divergent: bool) -> None:
    r = run_turns(divergent, steps=DEMO_STEPS, prompt_len=8)
    assert r.name == TURN_PATHS[int(divergent)]
    assert r.logits_equal and r.max_abs_diff == 0.0
    assert r.blocks_moved > 0 and r.checksums_verified > 0
    assert ("cut" in r.note) == divergent


def test_the_uncut_tail_changes_turn_two() -> None:
    r = run_turns(
        True, steps=DEMO_STEPS, prompt_len=8, mutants=frozenset({"append_divergent_uncut"})
    )
    assert not r.logits_equal and "NOT cut" in r.note


def test_truncate_cuts_both_stores() -> None:
    from refimpl.demo.turns import _length, _truncate

    kv = ContiguousKV(DEMO_CONFIG)
    kv.write(0, 0, torch.zeros(DEMO_CONFIG.kv_heads, 5, DEMO_CONFIG.head_dim),
             torch.zeros(DEMO_CONFIG.kv_heads, 5, DEMO_CONFIG.head_dim))  # fmt: skip
    _truncate(kv, 3)
    assert kv.k[0].shape[1] == 3
    p = PagedKV.empty(DEMO_CONFIG, "heads_major", 4, 16)
    p.kv.num_tokens = 9
    _truncate(p, 4)
    assert _length(p) == 4
