"""The z3 action registry: the spec's actions by name (``spec.actions.ACTIONS``), each
traced from its Python definition (``symbolic.trace``), none written again here.

``PER_REQ``: actions of one request (``arg`` "req" or "msg"), ``Rules`` per (ctx, view,
message); ``GLOBAL``: the global ones, ``Rules`` per ctx. ``EnvCrash`` acts on every
request (its z3 form is still written here by hand: ``EnvCrash`` below).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from model_checks.symbolic.core import IN, ITE, RV, A, Ctx, Msg, N, O, Rules, Z
from model_checks.symbolic.tracer.trace import traced, traced_global
from spec.actions import ACTIONS
from spec.config import Config
from spec.state import (
    CHUNKS,
    COMPLETE,
    FAILED,
    G_END_FAILED,
    IDLE,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUEUED,
    RUNNING,
    TO_DECODE,
    TO_PREFILL,
    WRITABLE,
)

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
    return not c.restarts and not c.host_cache and not c.turns and not c.layers


_missing = set(ACTIONS) - set(PER_REQ) - set(GLOBAL) - set(WORKER) - set(UNENCODED)
if _missing:  # pragma: no cover - a spec action without a z3 encoding
    raise ImportError(f"z3 encoding lacks actions {sorted(_missing)}")


# -- the worker crash: every request at once (not traced yet) ------------------------------
LIVE = (QUEUED, PREFILLING, RUNNING, PREEMPTED)


def fault(x: Ctx, kind: str) -> Z:
    return A(x.c.fault_kinds[kind], x.faults < x.c.faults)


@dataclass
class Crash:
    """``EnvCrash(worker)``: when ``cond``, every request changes by ``per_req`` (its
    messages keep only the kinds in ``keep``) and the globals by ``glob``."""

    cond: Z
    glob: dict[str, Z]
    per_req: Callable[[RV], dict[str, Z]]
    keep: frozenset[int]


_HELD = (COMPLETE, WRITABLE)


def EnvCrash(x: Ctx, worker: int) -> Crash:
    if worker == 0:

        def lost_p(r: RV) -> dict[str, Z]:
            fails = A(IN(r.st, LIVE), N(IN(r.d, _HELD)))
            out = {"p": NONE, "h": NONE, "hl": 0, "gl": 0, "ps": IDLE, "sent": 0, "phit": 0}
            out["pstep"] = 0
            out["st"] = ITE(fails, FAILED, r.st)
            out["g"] = ITE(fails, r.g | G_END_FAILED, r.g)
            return out

        keep = frozenset(k for k in TO_DECODE if k not in CHUNKS)
        cond = A(fault(x, "crash"), x.p_up)
        return Crash(cond, {"p_up": False, "faults": x.faults + 1}, lost_p, keep)

    def lost_d(r: RV) -> dict[str, Z]:
        lost = O(r.d == WRITABLE, A(r.st == RUNNING, N(IN(r.p, _HELD)), r.h != COMPLETE))
        fails = A(IN(r.st, LIVE), lost)  # spec: _lost_with_decode
        out = {"d": NONE, "hit": 0, "landed": x.lempty(), "rmask": x.rzero(), "rcnt": 0}
        out["dfl"] = 0
        out["dstep"] = 0
        out["dmask"] = 0
        out["sl"] = 0
        out["st"] = ITE(fails, FAILED, r.st)
        out["g"] = ITE(fails, r.g | G_END_FAILED, r.g)
        return out

    glob = {"d_up": False, "pfx": False, "pfx_ref": 0, "faults": x.faults + 1}
    return Crash(A(fault(x, "crash"), x.d_up), glob, lost_d, frozenset(TO_PREFILL))
