"""What every layout proof shares: ``LayoutClaim``, the solver loop (``check_instances``:
every law of every instance as "the negation is unsat"), and small z3 term helpers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

Z = Any  # z3 terms are untyped (no stubs)


@dataclass(frozen=True)
class LayoutClaim:
    id: str  # "layout:tp:8->2", "layout:cp:4", "layout:block_size:16->8", ...
    method: str  # always "bijection"
    result: str  # "proved" | "violated" | "unknown"
    seconds: float  # wall time of building and solving every instance
    detail: str  # what was covered, or the counterexample


Instance = tuple[str, Z, dict[str, Z], Callable[[Any], str]]  # name, domain, laws, render


def check_instances(
    claim_id: str, instances: Sequence[Callable[[], Instance]], covered: str
) -> LayoutClaim:
    r"""Prove each law of each instance: domain /\ violation must be unsat."""
    t0 = time.perf_counter()
    solver = z3.Solver()
    solver.set("timeout", 20000)
    for make in instances:
        name, domain, laws, render = make()
        for law, violation in laws.items():
            solver.push()
            solver.add(domain, violation)
            verdict = solver.check()
            model = solver.model() if verdict == z3.sat else None
            solver.pop()
            if verdict == z3.unsat:
                continue
            seconds = time.perf_counter() - t0
            if model is None:
                text = f"{name}: {law}: solver says {verdict}"
                return LayoutClaim(claim_id, "bijection", "unknown", seconds, text)
            text = f"{name}: {law} violated: {render(model)}"
            return LayoutClaim(claim_id, "bijection", "violated", seconds, text)
    seconds = time.perf_counter() - t0
    text = f"{len(instances)} instances: {covered}"
    return LayoutClaim(claim_id, "bijection", "proved", seconds, text)


def not_once(conds: Sequence[Z]) -> Z:
    """Not exactly one of conds holds (a pseudo-Boolean constraint)."""
    return z3.Not(z3.PbEq([(c, 1) for c in conds], 1)) if conds else z3.BoolVal(True)


def lookup(row: Sequence[int], i: Z) -> Z:
    """row[i] as a z3 term (-1 outside the row)."""
    out: Z = z3.IntVal(-1)
    for k, value in enumerate(row):
        out = z3.If(i == k, value, out)
    return out


def at_index(heads: range, i: Z) -> Z:
    """heads[i] for a symbolic i, as Python's range defines it."""
    return heads.start + heads.step * i


def between(lo: int, x: Z, hi: int) -> Z:
    return z3.And(lo <= x, x < hi)


def in_run(key: Z, k: int, pos: Z, start: int, n: int) -> Z:
    """(key, pos) lies in the run of n slots from (k, start)."""
    return z3.And(key == k, between(start, pos, start + n))


def differ(a: Sequence[Z], b: Sequence[Z]) -> Z:
    return z3.Or([x != y for x, y in zip(a, b, strict=True)])


def misplaced(x: Z, moves: Sequence[tuple[int, Z, Z]]) -> Z:
    """Some piece (length, where it reads, where it writes) moves offset x elsewhere."""
    return z3.Or(z3.BoolVal(False), *[z3.And(between(0, x, n), a != b) for n, a, b in moves])
