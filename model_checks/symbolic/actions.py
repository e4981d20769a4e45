"""The z3 action registry: the spec's actions by name (``spec.actions.ACTIONS``).

``PER_REQ``: actions of one request (``arg`` "req" or "msg"), ``Rules`` per (ctx, view,
message); ``DecodeEvictPrefix`` is global and ``EnvCrash`` acts on every request.
"""

from __future__ import annotations

from collections.abc import Callable

from model_checks.symbolic import actions_decode as D
from model_checks.symbolic import actions_prefill as P
from model_checks.symbolic.behaviours import async_steps as AS
from model_checks.symbolic.behaviours import decode_failure as DF
from model_checks.symbolic.behaviours import decode_ranks as DR
from model_checks.symbolic.behaviours import retract as RT
from model_checks.symbolic.core import RV, Ctx, Msg, Rules
from spec.actions import ACTIONS
from spec.config import Config

ReqFn = Callable[[Ctx, RV, Msg | None], Rules]

_MODULES = (P, D, AS, DF, RT, DR)  # the spec's action modules' mirrors, core first


def _mirror(name: str) -> ReqFn | None:
    for mod in _MODULES:
        fn: ReqFn | None = getattr(mod, name, None)
        if fn is not None:
            return fn
    return None


PER_REQ: dict[str, ReqFn] = {
    name: fn
    for name, a in ACTIONS.items()
    if a.arg in ("req", "msg") and (fn := _mirror(name)) is not None
}
GLOBAL = ("DecodeEvictPrefix", "DecodeRecyclePrefix")
WORKER = ("EnvCrash",)

# Spec actions the z3 encoding does not mirror (yet), all behind a Config switch: restarts
# (``EnvRestart``, ``Config.restarts``). ``encodable`` says which configs the encodings
# take; the others (and their mutants) are checked by the explicit explorer only.
UNENCODED: tuple[str, ...] = ("EnvRestart",)
# The shared host cache (``spec/behaviours/host_cache.py``, ``Config.host_cache``): its
# world fields (hc, hc_hl, hc_pin, hc_late, hc_bad) and Req.hk are not in FIELDS yet.
UNENCODED += tuple(n for n in ACTIONS if n.startswith("Host")) + ("EnvLoadFail",)
# Multi-turn append on decode (``Config.turns``, spec/behaviours/turns.py): not mirrored yet.
UNENCODED += ("TurnEnd", "TurnEdit", "TurnRoute", "TurnPrefill", "DecodeTurnCut")
UNENCODED += ("DecodeAppend", "DecodeAppendCommit", "SessionEvict")


def encodable(c: Config) -> bool:
    """Does the z3 encoding model every action ``c`` enables?"""
    return not c.restarts and not c.host_cache and not c.turns


_missing = set(ACTIONS) - set(PER_REQ) - set(GLOBAL) - set(WORKER) - set(UNENCODED)
if _missing:  # pragma: no cover - a spec action without a z3 mirror
    raise ImportError(f"z3 encoding lacks actions {sorted(_missing)}")
