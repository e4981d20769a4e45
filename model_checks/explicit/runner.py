"""Run the checks: a config (safety on every state, then liveness on the same graph),
the default suite, one mutant, or all of them. No printing here: see cli.py."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from model_checks.explicit.explore import Graph, Progress, explore
from model_checks.explicit.liveness import check_liveness
from model_checks.explicit.parallel import explore_parallel
from model_checks.explicit.trace import Step, Trace, concretize
from spec.config import DEFAULT_SUITE, get_config
from spec.invariants import INVARIANTS
from spec.mutants import get_mutant
from spec.properties import LIVENESS, SAFETY

MAX_STATES = 2_000_000  # the explorer's default state bound (``kvown check --max-states``)


@dataclass
class Violation:
    prop: str
    config: str
    steps: list[Step]
    note: str = ""


@dataclass
class ConfigResult:
    name: str
    graph: Graph
    seconds: float  # exploration + liveness, wall clock
    violations: dict[str, Violation] = field(default_factory=dict)  # by property ID
    cpu_seconds: float = 0.0  # the same span in CPU time (what a shared machine keeps)

    def summary(self) -> dict[str, object]:
        cpu = self.cpu_seconds
        return {
            "name": self.name,
            "distinct_states": self.graph.n_states,
            "edges": self.graph.n_edges,
            "depth": self.graph.max_depth,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(cpu, 3),
            "states_per_cpu_second": round(self.graph.n_states / cpu) if cpu > 0 else None,
        }


def check_config(
    name: str,
    mutants: frozenset[str] = frozenset(),
    *,
    symmetry: bool = True,
    liveness: bool = True,
    stop_on: str | None = None,
    progress: Progress | None = None,
    workers: int = 1,
    por: bool = False,
    max_states: int = MAX_STATES,
) -> ConfigResult:
    """Explore ``name`` exhaustively; record the shortest counterexample per property.

    ``workers`` > 1: the parallel explorer (``parallel.explore_parallel``), the same graph;
    its CPU time counts the worker processes'. ``por``: partial-order reduction (safety
    and transition properties only: liveness is not checked on a reduced graph, and a
    counterexample may be longer); not with ``workers``. More than ``max_states`` states:
    ``graph.StateBound`` (a verdict on the states explored, not an error)."""
    c = get_config(name)
    t0, c0 = time.perf_counter(), _cpu()
    if workers > 1:
        if por:
            raise ValueError("por is not available with workers > 1")
        g = explore_parallel(
            c,
            mutants,
            workers=workers,
            symmetry=symmetry,
            stop_on=stop_on,
            progress=progress,
            max_states=max_states,
        )
    else:
        g = explore(
            c,
            mutants,
            symmetry=symmetry,
            stop_on=stop_on,
            progress=progress,
            por=por,
            max_states=max_states,
        )
    res = ConfigResult(name, g, 0.0)
    for pid in sorted({*g.first_violation, *g.first_step_violation}):
        path = g.violation_path(pid)
        assert path is not None
        res.violations[pid] = Violation(pid, name, concretize(g, path))
    if liveness and not por and (stop_on is None or stop_on not in g.first_violation):
        for lr in check_liveness(g):
            if not lr.holds and lr.path is not None:
                res.violations[lr.prop] = Violation(lr.prop, name, concretize(g, lr.path), lr.note)
    res.seconds = time.perf_counter() - t0
    res.cpu_seconds = _cpu() - c0
    return res


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (the workers)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def check_suite(
    names: tuple[str, ...] = DEFAULT_SUITE,
    on_config: Callable[[str], Progress | None] | None = None,
    workers: int = 1,
) -> list[ConfigResult]:
    return [
        check_config(n, progress=on_config(n) if on_config is not None else None, workers=workers)
        for n in names
    ]


def property_rows(results: list[ConfigResult]) -> list[dict[str, object]]:
    """One row per property: kind, verdict, configs checked, states, seconds."""
    rows = []
    states = sum(r.graph.n_states for r in results)
    seconds = sum(r.seconds for r in results)
    for p in (*SAFETY, *LIVENESS):
        broken = [r.name for r in results if p.id in r.violations]
        rows.append(
            {
                "id": p.id,
                "kind": p.kind,
                "holds": not broken,
                "configs": len(results),
                "violated_in": broken,
                "states": states,
                "seconds": round(seconds, 3),
            }
        )
    return rows


def invariant_rows(results: list[ConfigResult]) -> list[dict[str, object]]:
    """One row per conjunct of INVARIANTS.md (kind ``invariant``): the configs where it
    is claimed (``Conjunct.applies``) and evaluated on every state, and where it broke."""
    rows = []
    for j in INVARIANTS.values():
        claimed = [r for r in results if j.applies(r.graph.config)]
        broken = [r.name for r in claimed if j.name in r.violations]
        rows.append(
            {
                "id": j.name,
                "kind": "invariant",
                "holds": not broken,
                "configs": len(claimed),
                "violated_in": broken,
                "states": sum(r.graph.n_states for r in claimed),
                "seconds": round(sum(r.seconds for r in claimed), 3),
            }
        )
    return rows


@dataclass
class MutantResult:
    name: str
    expected: str
    config: str
    violated: list[str]  # every property it broke on that config
    trace: Trace | None  # the shortest counterexample for the expected property
    seconds: float

    @property
    def caught(self) -> bool:
        return self.expected in self.violated

    @property
    def trace_length(self) -> int | None:
        return len(self.trace.steps) if self.trace is not None else None


@functools.cache
def check_mutant(name: str, workers: int = 1) -> MutantResult:
    """Check a mutant on the configs where it must fail; stop at the first that catches it.

    Deterministic, so the result is cached per process (treat it as read-only)."""
    mu = get_mutant(name)
    is_safety = mu.expected in INVARIANTS or any(p.id == mu.expected for p in SAFETY)
    last: MutantResult | None = None
    for cname in mu.configs:
        t0 = time.perf_counter()
        r = check_config(
            cname,
            frozenset({name}),
            liveness=not is_safety,
            stop_on=mu.expected if is_safety else None,
            workers=workers,
        )
        v = r.violations.get(mu.expected)
        trace = Trace(cname, name, mu.expected, v.steps) if v is not None else None
        last = MutantResult(
            name, mu.expected, cname, sorted(r.violations), trace, time.perf_counter() - t0
        )
        if last.caught:
            return last
    assert last is not None
    return last
