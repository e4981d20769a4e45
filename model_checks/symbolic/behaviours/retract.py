"""z3 side of ``spec/behaviours/retract.py``: the parts of the inductive invariant that a
retraction adds (spec/INVARIANTS.md); ``DecodeRetract`` is traced from the spec."""

from __future__ import annotations

from model_checks.symbolic.core import RV, A, Ctx, N, O, Z, flag
from spec.state import DF_FENCED, IDLE, NONE, PREEMPTED

__all__ = ["ack_retracted", "retracted"]


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
