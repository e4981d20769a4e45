"""z3 mirror of ``spec/behaviours/async_steps.py``: the step actions, the step parts of
``FrozenSnapshot`` and ``NoReuseUnderIO``, and the strengthening conjunct ``StepHeld``.

The guards that refuse a free or a freeze under a step live in the spec's prefill and
decode actions; their z3 mirrors call ``busy_*`` here (same order, same property).
"""

from __future__ import annotations

from model_checks.symbolic.core import IN, RV, A, Ctx, Msg, N, O, Rules, Z
from spec.state import IDLE, NONE, PREFILLING, RUNNING, WRITABLE


def busy_free(x: Ctx, r: RV, worker: str) -> Z:
    """``step_blocks_free``: the condition under which a free of ``worker``'s replica is
    refused (``NoReuseUnderIO``); False under the mutant."""
    if "free_with_step_in_flight" in x.m:
        return False
    return A(x.c.async_steps, (r.pstep if worker == "p" else r.dstep) != 0)


def busy_freeze(x: Ctx, r: RV) -> Z:
    """``step_blocks_freeze`` (``FrozenSnapshot``)."""
    if "freeze_with_step_in_flight" in x.m:
        return False
    return A(x.c.async_steps, r.pstep != 0)


def busy_preempt(x: Ctx, r: RV) -> Z:
    """``step_blocks_preempt`` (``NoReuseUnderIO``)."""
    if "preempt_with_step_in_flight" in x.m:
        return False
    return A(x.c.async_steps, r.pstep != 0)


def PrefillStepDispatch(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillStepDispatch")
    R.no(O(N(x.c.async_steps), N(x.p_up), r.pstep != 0, r.p != WRITABLE, r.ps != IDLE))
    R.go(O(r.st == PREFILLING, A(r.st == RUNNING, r.h == NONE)), pstep=1)
    R.no(True)
    return R


def PrefillStepComplete(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillStepComplete")
    R.no(O(N(x.c.async_steps), N(x.p_up), r.pstep == 0))
    R.go(r.st == PREFILLING, pstep=0, st=RUNNING)
    R.go(pstep=0)
    return R


def DecodeStepDispatch(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeStepDispatch")
    R.no(O(N(x.c.async_steps), N(x.d_up), r.dstep != 0, r.d != WRITABLE, r.st != RUNNING))
    R.go(dstep=1)
    return R


def DecodeStepComplete(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeStepComplete")
    R.no(O(N(x.c.async_steps), N(x.d_up), r.dstep == 0))
    R.go(dstep=0)
    return R


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


__all__ = [
    "STEP_HELD_DOC",
    "DecodeStepComplete",
    "DecodeStepDispatch",
    "PrefillStepComplete",
    "PrefillStepDispatch",
    "busy_free",
    "busy_freeze",
    "busy_preempt",
    "step_held",
    "steps_held",
    "steps_write_writable",
]
