"""Every model-check counterexample replays on the engine: the gaps test_engine_mutants
leaves (it covers the safety mutants step by step, their violation and their refusal
by the correct engine).

- Determinism, for every mutant: two fresh engines given the counterexample with the
  mutant on are in the same real state (block tables, pool bytes, wire bytes) after
  every step.
- The liveness mutants: the trace replays step by step (``abstract()`` equals the
  mutant spec's states). From its last state the engine with the bug cannot finish by
  the steps the property allows: an exhaustive search over the engine's own accepted
  steps (not the spec's) finds no way out, while real blocks stay held. The same trace
  is legal for the correct spec, and the correct engine finishes from there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from model_checks.explicit.liveness import LOSSY
from model_checks.explicit.trace import replay
from refimpl.engine import Engine
from refimpl.errors import OwnershipError
from spec.actions import ACTIONS, WORKERS, Action, encode_args
from spec.config import Config
from spec.mutants import MUTANTS
from spec.properties import LIVENESS, decode_waiting, quiescent_terminal
from spec.state import World, canonical

try:  # share test_engine_mutants' cache (pytest's default import mode puts tests/ first)
    from test_engine_mutants import counterexample
except ImportError:  # pragma: no cover - another import mode
    from tests.refimpl.test_engine_mutants import counterexample

LIVE_IDS = {p.id for p in LIVENESS}
LIVENESS_MUTANTS = [n for n, mu in MUTANTS.items() if mu.expected in LIVE_IDS]
SEARCH_LIMIT = 5000  # engine states; the spec's own sets here are at most a few hundred


def _allowed(prop: str) -> Callable[[Action], bool]:
    """The steps a liveness property grants: all but the client's (NoDeadlock: a cancel
    is never the only way out), protocol steps only (FairTermination's first check),
    protocol steps and non-lossy faults (RecoverWithoutTimeout), or decode's own steps
    and timeouts (BoundedExit)."""
    if prop == "NoDeadlock":
        return lambda a: a.kind != "client"
    if prop == "FairTermination":
        return lambda a: a.kind in ("local", "recv")
    if prop == "RecoverWithoutTimeout":  # protocol steps and the faults that lose nothing
        return lambda a: a.kind in ("local", "recv", "fault") and a.name not in LOSSY
    assert prop == "BoundedExit"
    return lambda a: a.actor == "D" and a.kind in ("local", "timeout")


def _goal(prop: str, c: Config) -> Callable[[World], bool]:
    if prop == "BoundedExit":
        return lambda w: not decode_waiting(w, c)
    return lambda w: quiescent_terminal(w, c)


def _steps(w: World, allowed: Callable[[Action], bool]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (action, args) worth offering the engine in abstract state ``w``."""
    for name, a in ACTIONS.items():
        if not allowed(a):
            continue
        if a.arg == "req":
            yield from ((name, encode_args(name, i, 0)) for i in range(len(w.reqs)))
        elif a.arg == "msg":
            for i, r in enumerate(w.reqs):
                yield from ((name, encode_args(name, i, code)) for code in sorted(set(r.net)))
        elif a.arg == "global":
            yield name, {}
        else:
            yield from ((name, {"worker": wk}) for wk in WORKERS)


def finish(
    c: Config,
    mutants: frozenset[str],
    trace: list[dict[str, Any]],
    allowed: Callable[[Action], bool],
    goal: Callable[[World], bool],
) -> bool:
    """Depth-first over the engine's accepted steps from the end of ``trace``: can it
    reach ``goal``? Each state is rebuilt by replaying its path on a fresh engine (an
    engine holds memory views, which do not copy). Raises past ``SEARCH_LIMIT`` states."""

    def build(path: list[dict[str, Any]]) -> Engine:
        e = Engine(c, mutants=mutants)
        e.replay(trace + path)
        return e

    start = build([])
    seen = {canonical(start.abstract())}
    stack: list[list[dict[str, Any]]] = [[]]
    while stack:
        path = stack.pop()
        scratch = build(path)
        w = scratch.abstract()
        if goal(w):
            return True
        for name, args in _steps(w, allowed):
            try:
                scratch.step(name, args)
            except OwnershipError:
                continue  # a refusal changes nothing: the scratch engine is still at ``w``
            key = canonical(scratch.abstract())
            if key not in seen:
                seen.add(key)
                stack.append([*path, {"action": name, "args": args}])
                assert len(seen) <= SEARCH_LIMIT, "the search does not end"
            scratch = build(path)
    return False


def real_state(e: Engine) -> tuple[object, ...]:
    """The abstract state, every block's bookkeeping and bytes, the wire's bytes: the
    parts of ``fingerprint()`` that compare across engines (its records hold views)."""
    return e.fingerprint()[:3]


def _held_blocks(e: Engine) -> int:
    return sum(p.alloc.capacity - p.alloc.num_free for p in (e.P, e.H, e.D))


@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_counterexample_replays_deterministically(name: str) -> None:
    c, steps = counterexample(name)
    a, b = Engine(c, mutants=frozenset({name})), Engine(c, mutants=frozenset({name}))
    for k, st in enumerate(steps):
        a.step(st["action"], st["args"])
        b.step(st["action"], st["args"])
        assert real_state(a) == real_state(b), f"step {k + 1} {st}"


@pytest.mark.parametrize("name", LIVENESS_MUTANTS)
def test_a_liveness_counterexample_strands_the_engine_with_the_bug(name: str) -> None:
    c, steps = counterexample(name)
    prop = MUTANTS[name].expected
    worlds = replay(c, frozenset({name}), steps)
    e = Engine(c, mutants=frozenset({name}))
    for k, st in enumerate(steps):
        e.step(st["action"], st["args"])
        assert e.abstract() == worlds[k + 1], f"step {k + 1} {st}"
    e.check_integrity()
    assert _held_blocks(e) > 0  # real blocks are held, and no allowed way frees them:
    assert not finish(c, frozenset({name}), steps, _allowed(prop), _goal(prop, c))


@pytest.mark.parametrize("name", LIVENESS_MUTANTS)
def test_the_correct_engine_finishes_from_the_same_trace(name: str) -> None:
    c, steps = counterexample(name)
    prop = MUTANTS[name].expected
    worlds = replay(c, frozenset(), steps)  # legal for the correct spec: no TraceError
    e = Engine(c)
    e.replay(steps)
    assert e.abstract() == worlds[-1]
    assert _held_blocks(e) > 0
    assert finish(c, frozenset(), steps, _allowed(prop), _goal(prop, c))
