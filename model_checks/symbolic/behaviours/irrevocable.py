"""z3 mirror of ``spec/behaviours/irrevocable.py``: writes that cannot be taken back."""

from __future__ import annotations

from model_checks.symbolic.core import IN, RV, A, Ctx, N, NetOp, Z
from spec.state import AWAIT_READY, M_CHUNK, M_CHUNK_BAD, SENDING

__all__ = ["fence", "may_fence", "quarantine_over", "writes_drained"]


def may_fence(x: Ctx) -> Z:
    """``irrevocable.may_fence``."""
    return True if "free_fenced_unrevocable" in x.m else x.c.revocable


def fence(x: Ctx, e: Z) -> NetOp:
    """``irrevocable.fence``: drop the writes of ``e`` in flight, on a revocable transport."""
    return NetOp("drop", e=e, when=x.c.revocable)


def writes_drained(x: Ctx, r: RV, e: Z) -> Z:
    """``irrevocable.writes_drained`` (the mutant reads the first task only)."""
    if "batch_status_subset" in x.m:
        return A(r.net.count(M_CHUNK, e, 0) == 0, r.net.count(M_CHUNK_BAD, e, 0) == 0)
    return r.net.no_chunks(e)


def quarantine_over(r: RV) -> Z:
    """``irrevocable.quarantine_over``."""
    sending = A(r.ep == r.dep, IN(r.ps, (AWAIT_READY, SENDING)))
    return A(N(sending), r.net.no_chunks(r.dep))
