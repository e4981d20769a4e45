"""Multi-turn append on decode on the reference engine (refimpl/engine/behaviours/turns.py):
a deterministic tour of turns_append's turn edges refines the spec step by step (every
refusal with the spec's property), each mutant's explorer counterexample replays on the
engine with the bug and is refused without it, and the append starts at the longest
common token-id prefix."""

from __future__ import annotations

import pytest

from model_checks.explicit.runner import check_config, check_mutant
from refimpl.engine.behaviours.turns import common_prefix
from refimpl.engine.core import Engine
from refimpl.errors import OwnershipError
from spec.actions import ACTIONS, apply, encode_args
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import World

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
    "name", ["append_after_evict", "append_divergent_uncut", "two_writers_on_session",
             "evict_pinned_session"]
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
