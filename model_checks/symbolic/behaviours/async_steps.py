"""z3 side of ``spec/behaviours/async_steps.py``: the step parts of ``FrozenSnapshot``
and ``NoReuseUnderIO``, and the strengthening conjunct ``StepHeld``. The step actions
and the guards that refuse a free or a freeze under a step are traced from the spec
(``symbolic.trace``)."""

from __future__ import annotations

from model_checks.symbolic.core import IN, RV, A, Ctx, N, O, Z
from spec.state import IDLE, NONE, WRITABLE


def steps_held(x: Ctx, r: RV) -> Z:
    """``NoReuseUnderIO``'s step part: a step in flight writes blocks still held."""
    return O(N(x.c.async_steps), A(O(r.pstep == 0, r.p != NONE), O(r.dstep == 0, r.d != NONE)))


def steps_write_writable(x: Ctx, r: RV) -> Z:
    """``FrozenSnapshot``'s step part: a step in flight writes a writable replica."""
    return O(
        N(x.c.async_steps),
        A(
            O(r.pstep == 0, A(IN(r.p, (NONE, WRITABLE)), r.ps == IDLE)),
            O(r.dstep == 0, IN(r.d, (NONE, WRITABLE))),
        ),
    )


STEP_HELD_DOC = (
    "a step register is 0 or 1, and 0 without async steps; a prefill step in flight has"
    " its writable, unfrozen replica on a live prefill, a decode step its writable"
    " replica on a live decode"
)


def step_held(x: Ctx, r: RV) -> Z:
    """The conjunct ``StepHeld``: the step registers are 0 or 1, and 0 without the
    switch; a prefill step in flight has its writable, unfrozen replica on a live
    prefill; a decode step its writable replica on a live decode."""
    return A(
        IN(r.pstep, (0, 1)),
        IN(r.dstep, (0, 1)),
        O(x.c.async_steps, A(r.pstep == 0, r.dstep == 0)),
        O(r.pstep == 0, A(r.p == WRITABLE, r.ps == IDLE, x.p_up)),
        O(r.dstep == 0, A(r.d == WRITABLE, x.d_up)),
    )


__all__ = ["STEP_HELD_DOC", "step_held", "steps_held", "steps_write_writable"]
