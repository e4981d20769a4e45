"""The z3 action registry: the spec's 41 actions by name (``spec.actions.ACTIONS``).

``PER_REQ``: actions of one request (``arg`` "req" or "msg"), ``Rules`` per (ctx, view,
message); ``DecodeEvictPrefix`` is global and ``EnvCrash`` acts on every request.
"""

from __future__ import annotations

from collections.abc import Callable

from model_checks.symbolic import actions_decode as D
from model_checks.symbolic import actions_prefill as P
from model_checks.symbolic.core import RV, Ctx, Msg, Rules
from spec.actions import ACTIONS

ReqFn = Callable[[Ctx, RV, Msg | None], Rules]

PER_REQ: dict[str, ReqFn] = {
    name: getattr(P, name) if hasattr(P, name) else getattr(D, name)
    for name, a in ACTIONS.items()
    if a.arg in ("req", "msg")
}
GLOBAL = ("DecodeEvictPrefix", "DecodeRecyclePrefix")
WORKER = ("EnvCrash",)

_missing = set(ACTIONS) - set(PER_REQ) - set(GLOBAL) - set(WORKER)
if _missing:  # pragma: no cover - a spec action without a z3 mirror
    raise ImportError(f"z3 encoding lacks actions {sorted(_missing)}")
