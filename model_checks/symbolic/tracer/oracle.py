"""The path oracle of the tracer (``trace``): each ``bool()`` of a symbolic condition
forks; an action is re-run once per path, each fork decided from a recorded prefix with
the other side queued, and conditions already decided on the path are folded (an
equality of a term with a value fixes or excludes it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import z3

from model_checks.symbolic.tracer import symstate as S

__all__ = ["MAX_PATHS", "Oracle", "paths"]

MAX_PATHS = 1024  # per action and call: a trace past it fails loudly


# -- the path oracle --------------------------------------------------------------------
_EQ_MEMO: dict[int, tuple[Any, Any]] = {}  # term id -> (term, its parts), per trace


def _eq_parts(t: Any) -> tuple[Any, int, bool] | None:
    """``(term, value, positive)`` for ``term == value`` / ``term != value``."""
    hit = _EQ_MEMO.get(t.get_id())
    if hit is None:
        hit = _EQ_MEMO[t.get_id()] = (t, _eq_parts_of(t))
    return hit[1]


def _eq_parts_of(t: Any) -> tuple[Any, int, bool] | None:
    pos = True
    if z3.is_not(t):
        t, pos = t.arg(0), False
    if not (z3.is_eq(t) or (z3.is_distinct(t) and t.num_args() == 2)):
        return None
    if z3.is_distinct(t):
        pos = not pos
    a, b = t.arg(0), t.arg(1)
    if z3.is_int_value(a) or z3.is_bv_value(a):
        a, b = b, a
    if z3.is_int_value(b):
        return a, b.as_long(), pos
    if z3.is_bv_value(b):
        return a, b.as_signed_long(), pos
    return None


class Oracle:
    """Replays ``prefix`` (one bool per fork), then takes True and records it."""

    def __init__(self, prefix: list[bool]) -> None:
        self.decisions = prefix
        self.pos = 0
        self.lits: list[Any] = []
        self.known: dict[int, bool] = {}  # term id -> its value on this path
        self.val: dict[int, int] = {}  # term id -> the value the path fixed
        self.ex: dict[int, set[int]] = {}  # term id -> values the path excluded

    def _fold(self, t: Any) -> bool | None:
        k = self.known.get(t.get_id())
        if k is not None:
            return k
        if z3.is_not(t) and (k := self.known.get(t.arg(0).get_id())) is not None:
            return not k
        eq = _eq_parts(t)
        if eq is None:
            return None
        x, v, pos = eq
        fixed = self.val.get(x.get_id())
        if fixed is not None:
            return (fixed == v) == pos
        if v in self.ex.get(x.get_id(), ()):
            return not pos
        return None

    def _learn(self, t: Any, b: bool) -> None:
        self.known[t.get_id()] = b
        eq = _eq_parts(t)
        if eq is not None:
            x, v, pos = eq
            if pos == b:
                self.val[x.get_id()] = v
            else:
                self.ex.setdefault(x.get_id(), set()).add(v)

    def decide(self, t: Any) -> bool:
        f = self._fold(t)
        if f is not None:
            return f
        if self.pos < len(self.decisions):
            b = self.decisions[self.pos]
        else:
            b = True
            self.decisions.append(b)
        self.pos += 1
        self.lits.append(t if b else z3.Not(t))
        self._learn(t, b)
        return b


def paths(run: Callable[[], Any]) -> Iterator[tuple[list[Any], Any]]:
    """``(condition literals, outcome)`` of every path of ``run``; an outcome is what
    ``run`` returned, or None for a path that left TypeOK (``symstate.Infeasible``)."""
    prefix: list[bool] = []
    for _ in range(MAX_PATHS):
        oracle = Oracle(prefix)
        S.PATH.decide = oracle.decide
        try:
            out = run()
        except S.Infeasible:
            out = None
        finally:
            S.PATH.decide = None
        yield oracle.lits, out
        d = oracle.decisions
        while d and d[-1] is False:
            d.pop()
        if not d:
            return
        d[-1] = False
        prefix = d
    raise S.TraceError(f"more than {MAX_PATHS} paths")
