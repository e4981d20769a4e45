"""The z3 action registry: the spec's actions by name (``spec.actions.ACTIONS``), each
traced from its Python definition (``symbolic.trace``), none written again here.

``PER_REQ``: actions of one request (``arg`` "req" or "msg"), ``Rules`` per (ctx, view,
message); ``GLOBAL``: the global ones, ``Rules`` per ctx. ``EnvCrash`` acts on every
request (its mirror is still the hand-written ``actions_decode.EnvCrash``).
"""

from __future__ import annotations

from collections.abc import Callable

from model_checks.symbolic.core import RV, Ctx, Msg, Rules
from model_checks.symbolic.trace import traced, traced_global
from spec.actions import ACTIONS
from spec.config import Config

ReqFn = Callable[[Ctx, RV, Msg | None], Rules]
GlobalFn = Callable[[Ctx], Rules]

# Spec actions the z3 encoding does not take (yet), all behind a Config switch: restarts
# (``EnvRestart``, ``Config.restarts``). ``encodable`` says which configs the encodings
# take; the others (and their mutants) are checked by the explicit explorer only.
UNENCODED: tuple[str, ...] = ("EnvRestart",)
# The shared host cache (``spec/behaviours/host_cache.py``, ``Config.host_cache``): its
# world fields (hc, hc_hl, hc_pin, hc_late, hc_bad) and Req.hk are not in FIELDS yet.
UNENCODED += tuple(n for n in ACTIONS if n.startswith("Host")) + ("EnvLoadFail",)
# Multi-turn append on decode (``Config.turns``, spec/behaviours/turns.py): not mirrored yet.
UNENCODED += ("TurnEnd", "TurnEdit", "TurnRoute", "TurnPrefill", "DecodeTurnCut")
UNENCODED += ("DecodeAppend", "DecodeAppendCommit", "SessionEvict")

PER_REQ: dict[str, ReqFn] = {
    name: traced(name)
    for name, a in ACTIONS.items()
    if a.arg in ("req", "msg") and name not in UNENCODED
}
GLOBAL_FNS: dict[str, GlobalFn] = {
    name: traced_global(name)
    for name, a in ACTIONS.items()
    if a.arg == "global" and name not in UNENCODED
}
GLOBAL = tuple(GLOBAL_FNS)
WORKER = ("EnvCrash",)


def encodable(c: Config) -> bool:
    """Does the z3 encoding model every action ``c`` enables?"""
    return not c.restarts and not c.host_cache and not c.turns


_missing = set(ACTIONS) - set(PER_REQ) - set(GLOBAL) - set(WORKER) - set(UNENCODED)
if _missing:  # pragma: no cover - a spec action without a z3 encoding
    raise ImportError(f"z3 encoding lacks actions {sorted(_missing)}")
