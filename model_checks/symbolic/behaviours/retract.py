"""z3 mirror of ``spec/behaviours/retract.py``: ``DecodeRetract``, the refetch epoch, and
the parts of the inductive invariant that a retraction adds (spec/INVARIANTS.md)."""

from __future__ import annotations

from model_checks.symbolic.behaviours.async_steps import busy_free
from model_checks.symbolic.core import ITE, RV, A, Ctx, Msg, N, O, Rules, Z, flag
from spec.state import DF_FENCED, IDLE, NONE, PREEMPTED, RUNNING, WRITABLE

__all__ = ["DecodeRetract", "ack_retracted", "refetch_epoch", "retracted"]


def DecodeRetract(x: Ctx, r: RV, a: Msg | None) -> Rules:
    # at call time: actions_decode imports actions_prefill, which imports this module
    from model_checks.symbolic.actions_decode import free

    c, R = x.c, Rules("DecodeRetract")
    R.no(O(N(c.retract), N(x.d_up), r.d != WRITABLE, r.st != RUNNING))
    R.no(r.mv >= c.max_moves)
    R.no(busy_free(x, r, "d"), "NoReuseUnderIO")
    st = RUNNING if "retract_loses_kv" in x.m else PREEMPTED
    R.go(st=st, mv=r.mv + 1, **free(x, r))
    return R


def refetch_epoch(x: Ctx, r: RV) -> Z:
    """``PrefillFreeze``'s epoch: ep + 1 (``spec.behaviours.retract.refetch_reuses_epoch``)."""
    if "retract_keeps_epoch" in x.m:
        return ITE(A(r.mv > 0, r.ep > 0), x.num(r.ep), x.num(r.ep + 1))
    return r.ep + 1


def retracted(x: Ctx, r: RV) -> Z:
    """Decode retracted the committed copy of the current attempt (retract worlds only):
    the request moved, decode holds nothing (and fenced nothing) of prefill's attempt."""
    return A(x.c.retract, r.mv >= 1, r.d == NONE, N(flag(r.dfl, DF_FENCED)), r.dep == r.ep)


def ack_retracted(x: Ctx, r: RV, e: Z) -> Z:
    """An Ack whose committed copy decode retracted: of an attempt before prefill's
    current one, or of the current one with decode holding nothing and prefill not
    sending (a request computed again has not frozen yet, or is preempted)."""
    again = A(e == r.ep, retracted(x, r), O(r.ps == IDLE, r.st == PREEMPTED))
    return A(x.c.retract, r.mv >= 1, O(e < r.ep, again))
