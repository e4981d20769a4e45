"""z3 side of ``spec/behaviours/decode_failure.py`` (decode fails an attempt itself): the
strengthening conjunct ``FailedNeedsSwitch``; ``DecodeFail`` is traced from the spec."""

from __future__ import annotations

from model_checks.symbolic.core import RV, Ctx, N, O, Z, flag
from spec.state import DF_FAILED

__all__ = ["FAILED_NEEDS_SWITCH_DOC", "failed_needs_switch"]

FAILED_NEEDS_SWITCH_DOC = (
    "an attempt is failed on decode (DF_FAILED) only where decode may fail attempts"
    " (Config.decode_failure)"
)


def failed_needs_switch(x: Ctx, r: RV) -> Z:
    """The strengthening conjunct ``FailedNeedsSwitch`` (``invariants.py``)."""
    return O(N(flag(r.dfl, DF_FAILED)), x.c.decode_failure)
