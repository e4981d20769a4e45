"""z3 mirror of ``spec/behaviours/decode_failure.py``: decode fails an attempt itself."""

from __future__ import annotations

from model_checks.symbolic.core import IN, RV, A, Ctx, Msg, N, O, Rules, Z, flag
from spec.state import DF_FAILED, FILLING, RESERVED

__all__ = ["FAILED_NEEDS_SWITCH_DOC", "DecodeFail", "attempt_failed", "failed_needs_switch"]

FAILED_NEEDS_SWITCH_DOC = (
    "an attempt is failed on decode (DF_FAILED) only where decode may fail attempts"
    " (Config.decode_failure)"
)


def attempt_failed(x: Ctx, r: RV) -> Z:
    """``decode_failure.attempt_failed``."""
    return A(x.c.decode_failure, flag(r.dfl, DF_FAILED))


def DecodeFail(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeFail")
    R.no(O(N(x.c.decode_failure), N(x.d_up), N(IN(r.d, (RESERVED, FILLING)))))
    R.no(flag(r.dfl, DF_FAILED))
    R.go(dfl=r.dfl | DF_FAILED)
    return R


def failed_needs_switch(x: Ctx, r: RV) -> Z:
    """The strengthening conjunct ``FailedNeedsSwitch`` (``invariants.py``)."""
    return O(N(flag(r.dfl, DF_FAILED)), x.c.decode_failure)
