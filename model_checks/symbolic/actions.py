"""The z3 action registry: the spec's 39 actions by name (``spec.actions.ACTIONS``).

``PER_REQ``: actions of one request (``arg`` "req" or "msg"), ``Rules`` per (ctx, view,
message); ``DecodeEvictPrefix`` is global and ``EnvCrash`` acts on every request.
"""

from __future__ import annotations

from collections.abc import Callable

from model_checks.symbolic import actions_decode as D
from model_checks.symbolic import actions_prefill as P
from model_checks.symbolic.core import RV, Ctx, Msg, Rules
from spec.actions import ACTIONS
from spec.config import Config

ReqFn = Callable[[Ctx, RV, Msg | None], Rules]

PER_REQ: dict[str, ReqFn] = {
    name: getattr(P, name) if hasattr(P, name) else getattr(D, name)
    for name, a in ACTIONS.items()
    if a.arg in ("req", "msg")
}
GLOBAL = ("DecodeEvictPrefix",)
WORKER = ("EnvCrash",)

# Spec actions the z3 encoding does not mirror (yet), all behind a Config switch: restarts
# (``EnvRestart``, ``Config.restarts``). ``encodable`` says which configs the encodings
# take; the others (and their mutants) are checked by the explicit explorer only.
UNENCODED = ("EnvRestart",)


def encodable(c: Config) -> bool:
    """Does the z3 encoding model every action ``c`` enables?"""
    return not c.restarts


_missing = set(ACTIONS) - set(PER_REQ) - set(GLOBAL) - set(WORKER) - set(UNENCODED)
if _missing:  # pragma: no cover - a spec action without a z3 mirror
    raise ImportError(f"z3 encoding lacks actions {sorted(_missing)}")
