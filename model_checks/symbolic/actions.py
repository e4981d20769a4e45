"""The z3 action registry: the spec's actions by name (``spec.actions.ACTIONS``), each
traced from its Python definition (``symbolic.trace``), none written again here.

``PER_REQ``: actions of one request (``arg`` "req" or "msg"), ``Rules`` per (ctx, view,
message); ``GLOBAL``: the global ones, ``Rules`` per ctx. ``WORKER``: ``EnvCrash`` and
``EnvRestart``, which act on a worker (and every request; traced by ``tracer.worker``).
"""

from __future__ import annotations

from collections.abc import Callable

from model_checks.symbolic.core import RV, Ctx, Msg, Rules
from model_checks.symbolic.tracer.trace import traced, traced_global
from model_checks.symbolic.tracer.worker import Crash, trace_worker
from spec.actions import ACTIONS

__all__ = [
    "FINITE_ONLY",
    "GLOBAL",
    "GLOBAL_FNS",
    "PER_REQ",
    "WORKER",
    "Crash",
    "EnvCrash",
]

ReqFn = Callable[[Ctx, RV, Msg | None], Rules]
GlobalFn = Callable[[Ctx], Rules]

# Every spec action is traced, in every config (tests/symbolic/test_tracer.py checks
# both). The actions of the behaviours whose fields only the finite encodings hold (the
# shared host cache, multi-turn append, streamed offers, restarts, sliding-window
# pruning): the unbounded model keeps those fields at 0, where these actions never fire,
# so it leaves them out.
_FINITE_MODULES = (
    "spec.behaviours.host_cache",
    "spec.behaviours.turns",
    "spec.stream.layers",
    "spec.behaviours.restarts",
    "spec.window",
)
FINITE_ONLY: tuple[str, ...] = tuple(
    n for n, a in ACTIONS.items() if a.fn.__module__ in _FINITE_MODULES
)

PER_REQ: dict[str, ReqFn] = {
    name: traced(name) for name, a in ACTIONS.items() if a.arg in ("req", "msg")
}
GLOBAL_FNS: dict[str, GlobalFn] = {
    name: traced_global(name) for name, a in ACTIONS.items() if a.arg == "global"
}
GLOBAL = tuple(GLOBAL_FNS)
WORKER = tuple(name for name, a in ACTIONS.items() if a.arg == "worker")  # tracer.worker

_missing = set(ACTIONS) - set(PER_REQ) - set(GLOBAL) - set(WORKER)
if _missing:  # pragma: no cover - a spec action without a z3 encoding
    raise ImportError(f"z3 encoding lacks actions {sorted(_missing)}")


# -- the worker actions: every request at once (``tracer.worker``) ------------------------
def EnvCrash(x: Ctx, worker: int) -> Crash:
    """``EnvCrash(worker)``, traced from ``spec.actions_env.EnvCrash``."""
    return trace_worker("EnvCrash", x, worker)
