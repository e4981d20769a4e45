"""Worker actions (``ActionDef.arg == "worker"``: ``EnvCrash``) traced from the spec.

A worker action changes the globals and maps every request the same way (``EnvCrash``:
``tuple(f(r) for r in w.reqs)``). It is traced twice on ``symstate`` stand-ins: on a
world with no request, for its guard and its global effect (one successor path: a
worker action that refuses, or whose global effect depends on a request, is not of
this shape and fails loudly); and on a world of the one request ``r``, for the map
(its fields, an if-then-else over the paths, and the message kinds it keeps: the spec
filters ``r.net`` by kind, which ``symstate.SymNet.__iter__`` follows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from model_checks.symbolic.core import ITE, RV, A, Ctx, Z
from model_checks.symbolic.tracer import symstate as S
from model_checks.symbolic.tracer.oracle import _EQ_MEMO, paths
from model_checks.symbolic.tracer.trace import (
    _GFIELDS,
    _RFIELDS,
    SymConfig,
    _changed,
    _fixed,
    _symbolic,
    sym_req,
    sym_world,
)
from spec.actions import ACTIONS
from spec.common import Refused
from spec.state import World

__all__ = ["Crash", "trace_worker"]

ALL_KINDS = frozenset(range(16))


@dataclass
class Crash:
    """A worker action: when ``cond``, every request changes by ``per_req`` (its
    messages keep only the kinds in ``keep``, known once ``per_req`` has run on a
    request) and the globals by ``glob``."""

    cond: Z
    glob: dict[str, Z]
    map_req: Callable[[RV], tuple[dict[str, Z], frozenset[int]]]
    kept: set[frozenset[int]] = field(default_factory=set)

    def per_req(self, r: RV) -> dict[str, Z]:
        ch, k = self.map_req(r)
        self.kept.add(k)
        if len(self.kept) > 1:
            raise S.TraceError("the kept messages depend on the request")
        return ch

    @property
    def keep(self) -> frozenset[int]:
        if not self.kept:
            raise S.TraceError("a worker action's kept messages read before its map ran")
        return next(iter(self.kept))


def _outcomes(name: str, x: Ctx, worker: int, w0: World) -> list[tuple[Z, World]]:
    _EQ_MEMO.clear()
    fn = ACTIONS[name].fn
    out: list[tuple[Z, World]] = []
    with _symbolic(x):
        S.TRACE.kinds = True
        try:
            c = SymConfig(x)
            for lits, res in paths(lambda: fn(w0, c, x.m, 0, worker)):  # type: ignore[arg-type]
                if isinstance(res, Refused) and res.prop is not None:
                    raise S.TraceError(f"{name}: a worker action refuses ({res.prop})")
                cond = A(*lits)
                if res is None or isinstance(res, Refused) or cond is False:
                    continue
                out.append((cond, res))
        finally:
            S.TRACE.kinds = False
    return out


def _keep(name: str, r: Any) -> frozenset[int]:
    net = r.net
    if isinstance(net, S.SymNet) and not net.ops:
        return ALL_KINDS
    if isinstance(net, tuple) and all(isinstance(k, S.KindOf) for k in net):
        return frozenset(k.kind for k in net)
    raise S.TraceError(f"{name}: a request's messages changed other than filtered by kind")


def _per_req(name: str, x: Ctx, worker: int, r: RV) -> tuple[dict[str, Z], frozenset[int]]:
    old = sym_req(r)
    outs = _outcomes(name, x, worker, sym_world(x, (old,)))
    keeps = {_keep(name, w.reqs[0]) for _, w in outs}
    if len(keeps) > 1:
        raise S.TraceError(f"{name}: the kept messages depend on the request")
    chs = []
    for cond, w in outs:
        _fixed(w, w.reqs[0])
        chs.append((cond, _changed(x, _RFIELDS, old, w.reqs[0], r)))
    # under the action's guard (a condition on the globals only) the paths cover every
    # request: the last one needs no condition of its own
    fields = {f for _, ch in chs for f in ch}
    out: dict[str, Z] = {}
    for f in sorted(fields):
        v = chs[-1][1].get(f, r.get(f))
        for cond, ch in reversed(chs[:-1]):
            v = ITE(cond, ch.get(f, r.get(f)), v)
        out[f] = v
    return out, keeps.pop() if keeps else ALL_KINDS


def trace_worker(name: str, x: Ctx, worker: int) -> Crash:
    """Worker action ``name`` on worker ``worker`` (0: prefill, 1: decode)."""
    w0 = sym_world(x, ())
    outs = _outcomes(name, x, worker, w0)
    if not outs:
        return Crash(False, {}, lambda r: ({}, ALL_KINDS))
    if len(outs) > 1:
        raise S.TraceError(f"{name}: more than one successor path on the globals")
    cond, w = outs[0]
    _fixed(w, None)
    glob = _changed(x, _GFIELDS, w0, w, x)
    cr = Crash(cond, glob, lambda r: _per_req(name, x, worker, r))
    views = x.views()
    if views:  # the kept kinds, known at once where the domain has its requests
        cr.per_req(views[0])
    return cr
