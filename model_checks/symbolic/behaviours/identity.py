"""z3 side of ``spec/behaviours/identity.py``: the invariant conjuncts of worlds without
staging (the unbounded model's ``Params.identity`` is False): nothing recycles the
cached prefix, nothing sends a chunk of an unstaged block, so no replica holds one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from model_checks.symbolic.core import RV, Ctx, N, Z, flag
from spec.state import DF_UNSTAGED, M_CHUNK_UNSTAGED


def prefix_own(x: Ctx) -> Z:
    """``PrefixOwn``: the cached prefix blocks hold the prefix's KV."""
    return x.pfx_ok


def staged_only(x: Ctx, r: RV) -> Z:
    """``StagedOnly``: no decode replica holds a chunk its sender never staged."""
    return N(flag(r.dfl, DF_UNSTAGED))


def no_unstaged(x: Ctx, r: RV, e: Z, i: Z) -> Z:
    """``NoUnstaged``: no chunk of an unstaged block is in flight."""
    return r.net.count(M_CHUNK_UNSTAGED, e, i) <= 0


C = TypeVar("C")


def conjuncts(make: Callable[..., C]) -> tuple[C, ...]:
    """The three conjuncts, built by ``make`` (``invariants.Conj``: name, scope, doc)."""
    return (
        make("PrefixOwn", "glob", "the cached prefix holds its own KV", glob=prefix_own),
        make("StagedOnly", "req", "no replica holds a chunk never staged", req=staged_only),
        make("NoUnstaged", "slot", "no chunk of an unstaged block in flight", slot=no_unstaged),
    )


__all__ = ["conjuncts", "no_unstaged", "prefix_own", "staged_only"]
