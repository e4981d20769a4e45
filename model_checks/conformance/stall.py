"""The end of a log: the requests holding blocks that no run of protocol steps frees."""

from __future__ import annotations

from model_checks.explicit.trace import describe
from spec import state as S
from spec.actions import ACTIONS, successors
from spec.common import Mutants
from spec.config import Config
from spec.state import Req, World

__all__ = ["stuck"]

_MOVES = frozenset({"local", "recv"})  # kinds that move a stalled state without a timeout
_NOTHING = (S.NONE, S.NONE, S.NONE, S.IDLE)


def _holds(r: Req) -> tuple[int, int, int, int]:
    """What a request holds, as the end-of-log stall check compares it."""
    return (r.p, r.d, r.h, r.ps)


def stuck(w: World, c: Config, m: Mutants, timed: bool, most: int) -> str | None:
    """The requests holding blocks that no run of protocol steps from ``w`` frees (a
    timeout counts as a step only when the log is ``timed``: then BoundedExit judges the
    wait); None if there are none, or the search is cut at ``most`` states."""
    held = {i for i, r in enumerate(w.reqs) if _holds(r) != _NOTHING}
    seen, todo = {w}, [w]
    while held and todo:
        x = todo.pop()
        for name, _i, _arg, s in successors(x, c, m):
            kind = ACTIONS[name].kind
            if s in seen or not (kind in _MOVES or (kind == "timeout" and timed)):
                continue
            held = {j for j in held if _holds(s.reqs[j]) != _NOTHING}
            if len(seen) >= most:
                return None
            seen.add(s)
            todo.append(s)
    return "; ".join(f"r{i}: {describe(w.reqs[i])}" for i in sorted(held)) or None
