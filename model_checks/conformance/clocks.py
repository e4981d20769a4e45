"""Time across workers: BoundedExit judged on per-worker clocks with a stated skew bound.

A wait is decode holding reserved, filling or quarantined blocks for an attempt (the
decode side) or prefill's sender not idle (the prefill side), the same attempt in every
candidate state. It is timed from each clock's first reading since it began, and judged
at every reading after: on the waiting worker's own clock the bound is ``timeout_s``;
each step to another clock (the start read on another worker's clock, or the reading
now) adds ``clock_skew_s``, the most two clocks may disagree. So a wait on decode is
judged even when decode logs no timestamp after it began, and a reading of another
worker's clock never judges a wait early. Two clocks that are seen to disagree by more
than ``clock_skew_s`` (a later line reads one of them lower; a log that states its skew
is refused for that by the parser) are not compared any more: from then on a wait is
judged across that pair by neither.
"""

from __future__ import annotations

from collections.abc import Sequence

from model_checks.conformance.events import Event
from spec.state import FILLING, IDLE, QUARANTINED, RESERVED, World

_D_WAIT = (RESERVED, FILLING, QUARANTINED)  # spec.properties.decode_waiting, per request
Starts = dict[str, tuple[float, int]]  # clock -> (its first reading in the wait, the line)


class Deadlines:
    """The open waits; ``observe`` each timed event, after the checker applied it."""

    def __init__(self, n_reqs: int, timeout_s: float, clock_skew_s: float) -> None:
        self.n, self.timeout, self.skew = n_reqs, timeout_s, clock_skew_s
        # (side, request) -> (epoch, the line the wait began, the first reading of each clock)
        self.waits: dict[tuple[str, int], tuple[int, int, Starts]] = {}
        self.last: dict[str, float] = {}  # each clock's latest reading
        self.apart: set[frozenset[str]] = set()  # pairs of clocks seen further apart than skew

    def _sync(self, e: Event) -> None:
        """Note the pairs of clocks that ``e``'s reading shows to disagree beyond the skew."""
        assert e.t is not None
        for k, t in self.last.items():
            if k != e.clock and t > e.t + self.skew + 1e-9:
                self.apart.add(frozenset((k, e.clock)))
        self.last[e.clock] = e.t

    def observe(self, e: Event, frontier: Sequence[World]) -> list[str]:
        """The waits past their deadline at ``e``'s reading, each said in one phrase."""
        self._sync(e)
        late: list[str] = []
        for i in range(self.n):
            for side in ("decode", "prefill"):
                rs = [w.reqs[i] for w in frontier]
                if side == "decode":
                    eps = {r.dep if r.d in _D_WAIT else -1 for r in rs}
                else:
                    eps = {r.ep if r.ps != IDLE else -1 for r in rs}
                ep = eps.pop() if len(eps) == 1 else -1
                old = self.waits.pop((side, i), None)
                if ep < 0:
                    continue
                if old is None or old[0] != ep:
                    old = (ep, e.line, {})
                assert e.t is not None
                old[2].setdefault(e.clock, (e.t, e.line))
                self.waits[(side, i)] = old
                why = self._late(side, e, old[2])
                if why:
                    head = f"{side} has waited on r{i} (epoch {ep}) since line {old[1]}"
                    late.append(f"{head}: {why}")
        return late

    def _late(self, side: str, e: Event, starts: Starts) -> str:
        assert e.t is not None
        for clock, (t0, line) in starts.items():
            if frozenset((clock, e.clock)) in self.apart:
                continue
            own = clock.split("/", 1)[0] == side
            steps = (0 if own else 1) + (0 if own and clock == e.clock else 1)
            if e.t - t0 <= self.timeout + steps * self.skew:
                continue
            bound = f"timeout_s={self.timeout:g}"
            if steps:
                bound += f" + {'2 x ' if steps == 2 else ''}clock_skew_s={self.skew:g}"
            return (
                f"{clock} clock t={t0:g} at line {line}, {e.clock} clock t={e.t:g} now:"
                f" {e.t - t0:g}s > {bound}"
            )
        return ""
