"""Refinement: random walks over the spec's enabled actions, replayed on the engine.

At every step: pick an action the spec enables in the engine's abstract state (weighted
toward protocol steps, so that walks go deep before a cancel or a fault ends them), apply
it to the engine, and require ``abstract()`` to equal the spec's successor, the
conservation law to hold and every committed replica to hold the ground truth. Then try every
action the spec refuses there naming a property, and one it does not enable: the engine
must refuse each with the same property and change nothing.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from refimpl.engine import Engine
from refimpl.errors import OwnershipError
from spec.actions import ACTIONS, apply, encode_args, successors
from spec.common import Refused
from spec.config import CONFIGS, DEFAULT_SUITE, SCALE, Config
from spec.state import M_ACK, M_CHUNK, M_HANDOFF, M_READY, World, msg

WEIGHTS = {"local": 10.0, "recv": 10.0, "timeout": 1.0, "fault": 1.5, "client": 0.5}
WALKS, MAX_LEN, NOT_ENABLED_PER_STEP = 150, 150, 1
# Worlds whose actions a deterministic tour refines instead of random walks (a walk
# rarely reaches their deep states): tests/behaviours/test_turns.py.
TOURED = frozenset({"turns_append"})
TOURED_ACTIONS = {n for n, a in ACTIONS.items() if a.fn.__module__ == "spec.behaviours.turns"}
BOGUS = (msg(M_HANDOFF, 3), msg(M_READY, 2, 1), msg(M_CHUNK, 1, 5), msg(M_ACK, 4))


def candidates(w: World) -> Iterator[tuple[str, int, int]]:
    """Every (action, request, argument) worth trying, enabled or not."""
    for name, a in ACTIONS.items():
        if a.arg == "req":
            yield from ((name, i, 0) for i in range(len(w.reqs)))
        elif a.arg == "msg":
            for i, r in enumerate(w.reqs):
                yield from ((name, i, code) for code in {*r.net, *BOGUS})
        elif a.arg == "global":
            yield name, 0, 0
        else:
            yield from ((name, 0, wk) for wk in (0, 1))


def walk_config(c: Config, seed: int) -> tuple[int, Counter[str], Counter[str]]:
    """Run the walks on ``c``; returns (steps, actions taken, properties refused)."""
    rng = random.Random(seed)
    taken: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    steps = 0
    for walk in range(WALKS):
        e = Engine(c, seed=walk)
        w = e.abstract()
        assert w == c.initial()
        trace: list[str] = []
        for _ in range(MAX_LEN):
            verdicts = [(x, apply(w, c, frozenset(), *x)) for x in candidates(w)]
            named = [(x, v) for x, v in verdicts if isinstance(v, Refused) and v.prop]
            unnamed = [(x, v) for x, v in verdicts if isinstance(v, Refused) and not v.prop]
            tries = named + rng.sample(unnamed, min(NOT_ENABLED_PER_STEP, len(unnamed)))
            for (name, i, arg), why in tries:
                assert isinstance(why, Refused)
                before = e.fingerprint()
                with pytest.raises(OwnershipError) as err:
                    e.step(name, encode_args(name, i, arg))
                assert err.value.prop == why.prop, (trace, name, encode_args(name, i, arg))
                assert e.fingerprint() == before, (trace, name, "changed the engine")
                refused[why.prop or "not enabled"] += 1
            succ = list(successors(w, c, frozenset()))
            if not succ:
                break
            name, i, arg, want = rng.choices(succ, [WEIGHTS[ACTIONS[s[0]].kind] for s in succ])[0]
            trace.append(f"{name}{encode_args(name, i, arg)}")
            e.step(name, encode_args(name, i, arg))
            got = e.abstract()
            assert got == want, trace
            e.check_integrity()
            assert e.damaged() == [], trace
            w = got
            taken[name] += 1
            steps += 1
    return steps, taken, refused


def test_random_walks_refine_the_spec_on_every_default_config() -> None:
    t0 = time.perf_counter()
    steps, taken, refused = 0, Counter[str](), Counter[str]()
    for k, name in enumerate(DEFAULT_SUITE):
        if name in TOURED:
            continue
        s, t, r = walk_config(CONFIGS[name], seed=k)
        steps, taken, refused = steps + s, taken + t, refused + r
    seconds = time.perf_counter() - t0
    rate = steps / seconds
    print(f"\n{steps} steps, {sum(refused.values())} refusals, {seconds:.1f} s, {rate:.0f} steps/s")
    missed = set(ACTIONS) - set(taken) - TOURED_ACTIONS
    assert not missed, f"never taken: {sorted(missed)}"
    # refusals naming each property the default suite can refuse with
    expected = {
        "CapacityRefcount",
        "FrozenSnapshot",
        "Fencing",
        "NoPartialUse",
        "NoReuseUnderIO",
        "StickyEnd",
        "RankAgreement",
        "PublishAfterCommit",
        "LoadXorStore",
        "not enabled",
    }
    assert expected <= set(refused), f"never refused with: {sorted(expected - set(refused))}"


@pytest.mark.parametrize("name", [*DEFAULT_SUITE, *SCALE])
def test_a_fresh_engine_is_the_initial_state(name: str) -> None:
    c = {**CONFIGS, **SCALE}[name]
    e = Engine(c)
    assert e.abstract() == c.initial()
    e.check_integrity()


def test_malformed_steps_and_unknown_mutants_are_value_errors() -> None:
    e = Engine(CONFIGS["handoff_tp2to1"])
    with pytest.raises(ValueError, match="unknown action"):
        e.step("PrefillTeleport", {"req": 0})
    with pytest.raises(ValueError, match="out of range"):
        e.step("PrefillAdmit", {"req": 3})
    with pytest.raises(ValueError, match="msg"):
        e.step("DecodeReserve", {"req": 0, "msg": "Hello", "epoch": 1, "idx": 0})
    with pytest.raises(ValueError, match="unknown mutants"):
        Engine(CONFIGS["handoff_tp2to1"], mutants=frozenset({"no_such_bug"}))


def test_the_fingerprint_sees_an_accepted_step() -> None:
    e = Engine(CONFIGS["handoff_tp2to1"])
    before = e.fingerprint()
    e.PrefillAdmit(0)
    assert e.fingerprint() != before
