"""Every model-check counterexample replays on the engine.

With the mutant switched on, the engine follows the mutant spec step by step
(``abstract()`` equals the spec's state after every step) into a state that breaks the
mutant's property, and where the bug reaches the bytes or the blocks, the damage is real.
On the correct engine the same trace is refused at the spec's first forbidden step, with
the same property, and the engine is left as it was.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from model_checks.explicit.runner import check_mutant
from model_checks.explicit.trace import TraceError, replay
from refimpl.engine import Engine
from refimpl.errors import IntegrityError, OwnershipError
from spec.actions import decode_args
from spec.config import Config, get_config
from spec.mutants import MUTANTS
from spec.properties import SAFETY, violated_safety
from spec.steps import check_step

SAFETY_IDS = {p.id for p in SAFETY}
SAFETY_MUTANTS = [n for n, mu in MUTANTS.items() if mu.expected in SAFETY_IDS]
# Replicas whose bytes the counterexample itself damages (the others break a protocol
# property first; their byte damage is shown in test_engine_incidents).
DAMAGE = {
    "source_writes_while_frozen": ["r0@p"],  # the frozen snapshot changed under the handoff
    "partial_as_complete": ["r0@d"],  # validated with nothing landed
    "failed_store_visible": ["r0@h"],  # a half-written host copy published
    "prefix_hash_unchecked": ["r0@d"],  # a recycled prefix block (other KV) taken as a hit
    "stream_reads_at_ready": ["r0@p"],  # blocks given back, no copy of their layers kept
}


@cache
def counterexample(name: str) -> tuple[Config, list[dict[str, Any]]]:
    res = check_mutant(name)
    assert res.caught and res.trace is not None, f"{name} is not caught by the model check"
    return get_config(res.config), res.trace.steps


@pytest.mark.parametrize("name", SAFETY_MUTANTS)
def test_counterexample_replays_with_the_mutant_on(name: str) -> None:
    c, steps = counterexample(name)
    worlds = replay(c, frozenset({name}), steps)
    e = Engine(c, mutants=frozenset({name}))
    for k, st in enumerate(steps):
        e.step(st["action"], st["args"])
        assert e.abstract() == worlds[k + 1], f"step {k + 1} {st}"
    last = steps[-1]
    i, arg = decode_args(last["action"], last["args"])
    on_step = check_step(worlds[-2], last["action"], i, arg, e.abstract(), c)  # a transition
    assert MUTANTS[name].expected in violated_safety(e.abstract(), c) + on_step
    assert e.damaged() == DAMAGE.get(name, [])
    if name == "evict_referenced_prefix":  # the prefix block is free but still referenced
        with pytest.raises(IntegrityError):
            e.check_integrity()
    else:
        e.check_integrity()


@pytest.mark.parametrize("name", SAFETY_MUTANTS)
def test_counterexample_is_refused_by_the_correct_engine(name: str) -> None:
    c, steps = counterexample(name)
    try:
        worlds = replay(c, frozenset(), steps)
        first, prop = len(steps), None
    except TraceError as err:
        first, prop = err.index, err.prop
        worlds = replay(c, frozenset(), steps[:first])
    e = Engine(c)
    for st in steps[:first]:
        e.step(st["action"], st["args"])
    assert e.abstract() == worlds[-1]
    if first == len(steps):  # every step is legal: the correct protocol stays safe
        assert violated_safety(e.abstract(), c) == []
        return
    before = e.fingerprint()
    with pytest.raises(OwnershipError) as err:
        e.step(steps[first]["action"], steps[first]["args"])
    assert err.value.prop == prop
    assert e.fingerprint() == before
    e.check_integrity()
    assert e.damaged() == []


def test_sweep_only_on_admit_leaves_decode_waiting_after_a_crash() -> None:
    c, steps = counterexample("sweep_only_on_admit")  # ends with prefill crashed
    bad, good = Engine(c, mutants=frozenset({"sweep_only_on_admit"})), Engine(c)
    bad.replay(steps)
    good.replay(steps)
    with pytest.raises(OwnershipError) as err:
        bad.DecodeTimeout(0)  # nothing can be admitted any more, so no sweep runs
    assert err.value.prop is None and bad.D.alloc.num_free == 0
    good.DecodeTimeout(0)
    assert good.D.alloc.num_free == good.D.alloc.capacity


def test_zero_block_handoff_never_reports_done_with_the_bug() -> None:
    c = get_config("prefix_share")  # the counterexample's stem (its check runs liveness)
    steps = [{"action": a, "args": {"req": 0}} for a in ("PrefillAdmit", "PrefillRun")]
    steps += [{"action": "PrefillFreeze", "args": {"req": 0}}]
    steps += [
        {"action": "DecodeReserve", "args": {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0}}
    ]  # a full prefix hit: zero blocks to send
    bad, good = Engine(c, mutants=frozenset({"zero_block_never_done"})), Engine(c)
    for e in (bad, good):
        e.replay(steps)
        e.PrefillRecvReady(0, "Ready", 1, 1)
        e.PrefillSendChunk(0)
    assert bad.wire.entries("0>d") == ()  # nothing to send, so nothing is sent at all
    with pytest.raises(OwnershipError) as err:
        bad.DecodeValidate(0)
    assert err.value.prop == "RankAgreement"
    good.DecodeReceiveDone(0, "RankDone", 1, 0)
    good.DecodeValidate(0)
    good.DecodeCommit(0)
    assert good.damaged() == []
