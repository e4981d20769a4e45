"""The z3 action registry: the spec's actions by name (``spec.actions.ACTIONS``), each
traced from its Python definition (``symbolic.trace``), none written again here.

``PER_REQ``: actions of one request (``arg`` "req" or "msg"), ``Rules`` per (ctx, view,
message); ``GLOBAL``: the global ones, ``Rules`` per ctx. ``WORKER``: ``EnvCrash``, which acts
on every request (traced by ``tracer.worker``).
"""

from __future__ import annotations

from collections.abc import Callable

from model_checks.symbolic.core import RV, Ctx, Msg, Rules
from model_checks.symbolic.tracer.trace import traced, traced_global
from model_checks.symbolic.tracer.worker import Crash, trace_worker
from spec.actions import ACTIONS
from spec.config import Config

__all__ = [
    "FINITE_ONLY",
    "GLOBAL",
    "GLOBAL_FNS",
    "PER_REQ",
    "UNENCODED",
    "WORKER",
    "Crash",
    "EnvCrash",
]

ReqFn = Callable[[Ctx, RV, Msg | None], Rules]
GlobalFn = Callable[[Ctx], Rules]

# Spec actions the z3 encoding does not take (yet), all behind a Config switch: restarts
# (``EnvRestart``, ``Config.restarts``: the incarnations ``p_inc``/``d_inc`` and the
# messages' incarnation are not in the symbolic state). ``encodable`` says which configs
# the encodings take; the others (and their mutants) are checked by the explorer only.
UNENCODED: tuple[str, ...] = ("EnvRestart",)
# The actions of the behaviours whose fields only the finite encodings hold (the shared
# host cache, multi-turn append): the unbounded model keeps those fields at 0, where
# these actions never fire, so it leaves them out.
FINITE_ONLY: tuple[str, ...] = tuple(
    n
    for n, a in ACTIONS.items()
    if a.fn.__module__ in ("spec.behaviours.host_cache", "spec.behaviours.turns", "spec.window")
)
# Streamed offers (``Config.layers``, spec/stream/layers.py): Req.lay/cpy/fs/inl/rdy not in FIELDS.
UNENCODED += ("PrefillSendLayer", "PrefillFreeSource", "DecodeInstallLayer", "DecodeLayerReady")

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
    return not c.restarts and not c.layers


_missing = set(ACTIONS) - set(PER_REQ) - set(GLOBAL) - set(WORKER) - set(UNENCODED)
if _missing:  # pragma: no cover - a spec action without a z3 encoding
    raise ImportError(f"z3 encoding lacks actions {sorted(_missing)}")


# -- the worker actions: every request at once (``tracer.worker``) ------------------------
def EnvCrash(x: Ctx, worker: int) -> Crash:
    """``EnvCrash(worker)``, traced from ``spec.actions_env.EnvCrash``."""
    return trace_worker("EnvCrash", x, worker)
