"""The action registry: every action's name, actor, kind and argument shape.

``kind`` drives the liveness checks:

- ``local``: a worker's own step; ``recv``: a worker consumes a message;
- ``timeout``: a bounded exit (not a fair action: a correct protocol needs none in a
  fault-free run); ``fault``: the environment, within the budget; ``client``: cancel.

``successors`` enumerates every enabled (action, request, argument) of a state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from spec import actions_decode as D
from spec import actions_env as E
from spec import actions_prefill as P
from spec import window as WN
from spec.behaviours import async_steps as A
from spec.behaviours import decode_failure as DF
from spec.behaviours import decode_ranks as DR
from spec.behaviours import host_cache as HC
from spec.behaviours import identity as I
from spec.behaviours import restarts as RS
from spec.behaviours import retract as RT
from spec.behaviours import turns as TU
from spec.common import Mutants, Refused, Result
from spec.config import Config
from spec.state import (
    CHUNKS,
    M_ACK,
    M_CHUNK,
    M_DONE,
    M_HANDOFF,
    M_HANDOFF_BAD,
    M_NACK,
    M_QUIESCED,
    M_READY,
    MSG_NAMES,
    World,
    msg,
    msg_epoch,
    msg_idx,
    msg_inc,
    msg_kind,
)
from spec.stream import layers as L

ActionFn = Callable[[World, Config, Mutants, int, int], Result]
ALL_MSGS = frozenset(MSG_NAMES)


@dataclass(frozen=True)
class Action:
    name: str
    actor: str  # "P" (scheduler/prefill), "D" (decode), "env", "client"
    kind: str  # "local", "recv", "timeout", "fault", "client"
    arg: str  # "req", "msg" (req + a message in flight), "worker", "global"
    fn: ActionFn
    msgs: frozenset[int] = frozenset()  # message kinds an "msg" action consumes


def _a(
    fn: ActionFn, actor: str, kind: str, arg: str = "req", msgs: frozenset[int] = frozenset()
) -> Action:
    return Action(fn.__name__, actor, kind, arg, fn, msgs)


_H = frozenset({M_HANDOFF, M_HANDOFF_BAD})
ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        _a(P.PrefillAdmit, "P", "local"),
        _a(P.PrefillRun, "P", "local"),
        _a(P.PrefillDecodeStep, "P", "local"),
        _a(P.PrefillFinish, "P", "local"),
        _a(P.PrefillPreempt, "P", "local"),
        _a(P.PrefillOffloadBegin, "P", "local"),
        _a(P.PrefillOffloadCopy, "P", "local"),
        _a(P.PrefillOffloadCommit, "P", "local"),
        _a(P.PrefillReloadBegin, "P", "local"),
        _a(P.PrefillReloadCopy, "P", "local"),
        _a(P.PrefillReloadCommit, "P", "local"),
        _a(P.PrefillFreeze, "P", "local"),
        _a(P.PrefillRecvReady, "P", "recv", "msg", frozenset({M_READY})),
        _a(P.PrefillSendChunk, "P", "local"),
        _a(P.PrefillRelease, "P", "recv", "msg", frozenset({M_ACK})),
        _a(P.PrefillResume, "P", "recv", "msg", frozenset({M_NACK})),
        _a(P.PrefillTimeout, "P", "timeout"),
        _a(P.PrefillQuiesce, "P", "local"),
        _a(P.PrefillDiscard, "P", "recv", "msg", frozenset({M_READY, M_ACK, M_NACK})),
        _a(D.DecodeReserve, "D", "recv", "msg", _H),
        _a(D.DecodeReject, "D", "recv", "msg", _H),
        _a(D.DecodeReceiveChunk, "D", "recv", "msg", CHUNKS),
        _a(D.DecodeReceiveDone, "D", "recv", "msg", frozenset({M_DONE})),
        _a(D.DecodeValidate, "D", "local"),
        _a(D.DecodeCommit, "D", "local"),
        _a(D.DecodeStep, "D", "local"),
        _a(D.DecodeFinish, "D", "local"),
        _a(D.DecodeAbort, "D", "local"),
        _a(D.DecodeAbortFenced, "D", "local"),
        _a(D.DecodeReclaim, "D", "recv", "msg", frozenset({M_QUIESCED})),
        _a(D.DecodeTimeout, "D", "timeout"),
        _a(D.DecodeEvictPrefix, "D", "local", "global"),
        _a(D.DecodeDiscard, "D", "recv", "msg", _H | frozenset({M_DONE, M_QUIESCED})),
        _a(E.EnvLose, "env", "fault", "msg", ALL_MSGS),
        _a(E.EnvDuplicate, "env", "fault", "msg", ALL_MSGS),
        _a(E.EnvCorrupt, "env", "fault", "msg", frozenset({M_CHUNK})),
        _a(E.EnvManifestMismatch, "env", "fault", "msg", frozenset({M_HANDOFF})),
        _a(E.EnvStoreFail, "env", "fault"),
        _a(E.EnvCrash, "env", "fault", "worker"),
        _a(E.ClientCancel, "client", "client"),
        _a(A.PrefillStepDispatch, "P", "local"),
        _a(A.PrefillStepComplete, "P", "local"),
        _a(A.DecodeStepDispatch, "D", "local"),
        _a(A.DecodeStepComplete, "D", "local"),
        _a(DF.DecodeFail, "D", "timeout"),
        _a(RT.DecodeRetract, "D", "local"),
        _a(DR.DecodeRankInstall, "D", "local"),
        _a(RS.EnvRestart, "env", "fault", "worker"),
        _a(I.PrefillStage, "P", "local"),
        _a(I.DecodeRecyclePrefix, "D", "local", "global"),
        _a(HC.HostLookup, "P", "local"),
        _a(HC.HostLoadBegin, "P", "local"),
        _a(HC.HostLoadCopy, "P", "local"),
        _a(HC.HostLoadCommit, "P", "local"),
        _a(HC.HostLoadFail, "P", "local"),
        _a(HC.HostStoreBegin, "P", "local"),
        _a(HC.HostStoreCopy, "P", "local"),
        _a(HC.HostPublish, "P", "local"),
        _a(HC.HostStoreAbort, "P", "timeout"),
        _a(HC.HostLateComplete, "P", "recv", "global"),
        _a(HC.HostEvict, "P", "timeout", "global"),
        _a(HC.HostFree, "P", "local", "global"),
        _a(HC.EnvLoadFail, "env", "fault", "global"),
        _a(TU.TurnEnd, "D", "local"),
        _a(TU.TurnEdit, "client", "client"),
        _a(TU.TurnRoute, "P", "local"),
        _a(TU.TurnPrefill, "P", "local"),
        _a(TU.DecodeTurnCut, "D", "local"),
        _a(TU.DecodeAppend, "D", "local"),
        _a(TU.DecodeAppendCommit, "D", "local"),
        _a(TU.SessionEvict, "D", "local"),
        _a(L.PrefillSendLayer, "P", "local"),
        _a(L.PrefillFreeSource, "P", "local"),
        _a(L.DecodeInstallLayer, "D", "local"),
        _a(L.DecodeLayerReady, "D", "local"),
        _a(WN.PrefillPruneWindow, "P", "local"),
    )
}

_REQ_ACTIONS = tuple(a for a in ACTIONS.values() if a.arg == "req")
_GLOBAL_ACTIONS = tuple(a for a in ACTIONS.values() if a.arg == "global")
_BY_MSG: dict[int, tuple[Action, ...]] = {
    k: tuple(a for a in ACTIONS.values() if a.arg == "msg" and k in a.msgs) for k in ALL_MSGS
}
WORKERS = ("prefill", "decode")

Edge = tuple[str, int, int, World]  # (action name, request slot, argument, successor)


def successors(w: World, c: Config, m: Mutants) -> Iterator[Edge]:
    """Every enabled (action, request, argument) of ``w`` and its successor."""
    for i, r in enumerate(w.reqs):
        for a in _REQ_ACTIONS:
            s = a.fn(w, c, m, i, 0)
            if type(s) is World:
                yield a.name, i, 0, s
        seen = -1
        for code in r.net:
            if code == seen:
                continue
            seen = code
            for a in _BY_MSG[msg_kind(code)]:
                s = a.fn(w, c, m, i, code)
                if type(s) is World:
                    yield a.name, i, code, s
    for a in _GLOBAL_ACTIONS:
        s = a.fn(w, c, m, 0, 0)
        if type(s) is World:
            yield a.name, 0, 0, s
    if "crash" in c.fault_kinds:
        for wk in (0, 1):
            s = E.EnvCrash(w, c, m, 0, wk)
            if type(s) is World:
                yield "EnvCrash", 0, wk, s
    if c.restarts:
        for wk in (0, 1):
            s = RS.EnvRestart(w, c, m, 0, wk)
            if type(s) is World:
                yield "EnvRestart", 0, wk, s


def apply(w: World, c: Config, m: Mutants, name: str, i: int, arg: int) -> Result:
    """Apply one action by name (guards included)."""
    a = ACTIONS.get(name)
    if a is None:
        raise KeyError(f"unknown action {name!r}; valid actions: {', '.join(ACTIONS)}")
    if a.arg != "global" and a.arg != "worker" and not 0 <= i < len(w.reqs):
        raise ValueError(f"{name}: request {i} out of range 0..{len(w.reqs) - 1}")
    if a.arg == "msg" and arg not in w.reqs[i].net:
        return Refused(None)
    return a.fn(w, c, m, i, arg)


_KIND_BY_NAME = {v: k for k, v in MSG_NAMES.items()}


def encode_args(name: str, i: int, arg: int) -> dict[str, Any]:
    """The trace form of an action's arguments."""
    a = ACTIONS[name]
    if a.arg == "worker":
        return {"worker": WORKERS[arg]}
    if a.arg == "global":
        return {}
    if a.arg == "msg":
        out: dict[str, Any] = {
            "req": i,
            "msg": MSG_NAMES[msg_kind(arg)],
            "epoch": msg_epoch(arg),
            "idx": msg_idx(arg),
        }
        if msg_inc(arg):  # only once a worker has restarted (spec/behaviours/restarts.py)
            out["inc"] = msg_inc(arg)
        return out
    return {"req": i}


_ARG_KEYS: dict[str, tuple[str, ...]] = {
    "worker": ("worker",),
    "global": (),
    "req": ("req",),
    "msg": ("req", "msg", "epoch", "idx", "inc"),
}


def check_arg_keys(name: str, shape: str, args: dict[str, Any]) -> None:
    """ValueError naming the arguments that an action of argument ``shape`` ("req",
    "msg", "worker", "global") does not take."""
    extra = sorted(str(k) for k in args if k not in _ARG_KEYS[shape])
    if extra:
        shown = ", ".join(repr(k[:40]) for k in extra[:3])
        takes = ", ".join(_ARG_KEYS[shape]) or "no arguments"
        raise ValueError(f"{name}: unknown argument {shown} (it takes: {takes})")


def decode_args(name: str, args: dict[str, Any]) -> tuple[int, int]:
    """Inverse of ``encode_args``; raises ValueError naming what is wrong."""
    a = ACTIONS.get(name)
    if a is None:
        raise ValueError(f"unknown action {name!r}")

    def _int(key: str) -> int:
        v = args.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name}: argument {key!r} must be a non-negative int, got {v!r}")
        return v

    check_arg_keys(name, a.arg, args)
    if a.arg == "worker":
        wk = args.get("worker")
        if wk not in WORKERS:
            raise ValueError(f"{name}: argument 'worker' must be one of {WORKERS}, got {wk!r}")
        return 0, WORKERS.index(wk)
    if a.arg == "global":
        return 0, 0
    i = _int("req")
    if a.arg == "msg":
        kind = _KIND_BY_NAME.get(args.get("msg"))  # type: ignore[arg-type]
        if kind is None:
            raise ValueError(f"{name}: argument 'msg' must be one of {sorted(_KIND_BY_NAME)}")
        e, idx = _int("epoch"), _int("idx")
        inc = _int("inc") if "inc" in args else 0
        if e > 0xFFFF or idx > 0xF or inc > 0xFF:
            raise ValueError(f"{name}: epoch, idx or inc out of range")
        return i, msg(kind, e, idx, inc)
    return i, 0
