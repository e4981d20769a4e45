"""The z3 ``Rules`` of a spec action, traced from its Python definition.

``traced(name)`` is a ``Rules`` function (``(Ctx, RV, Msg | None) -> Rules``, as the
encodings consume) that runs ``spec.actions.ACTIONS[name].fn`` on a ``World`` of
``symstate`` stand-ins, once per path: every ``bool()`` of a symbolic condition asks the
path oracle, which replays the decisions of the path being traced and queues the other
side (depth first). Each run ends in ``NOT_ENABLED``, a refusal naming its property, or
a successor; the path's decisions are its condition (disjoint by construction), the
successor's changed fields its effect; one reading another request, on each (``Go.others``).

While an action runs, the spec's primitives on messages and pools (``spec.common``:
``send``, ``take``, ``drop_chunks``, ``chunks_in_flight``, ``used_*``,
``admit_possible``, ``full_chunks``, ``full_ranks``, ``landed_at``, ``landed_chunks``;
``spec.state``'s ``msg*``; ``spec.behaviours.slots.slot_free``) are rebound, in every
module of ``spec`` that imports them, to their symbolic meaning over the ``Ctx`` (nothing
else of the spec is written again here).

A path decides each condition once: a condition already decided on the path, and
``x == k`` for an ``x`` whose value (or an excluded value) the path fixed, fold.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import z3

from model_checks.symbolic.core import (
    EXT_FIELDS,
    EXT_GLOBALS,
    FIELDS,
    GLOBALS,
    RV,
    A,
    Branch,
    Ctx,
    Go,
    Msg,
    NetOp,
    O,
    Rules,
)
from model_checks.symbolic.tracer import symstate as S
from model_checks.symbolic.tracer.oracle import _EQ_MEMO, paths
from spec import common, properties, state, steps
from spec.actions import ACTIONS
from spec.behaviours import decode_ranks, host_cache, slots
from spec.common import Refused
from spec.state import CHUNKS, Req, World


# -- the spec's primitives, symbolically --------------------------------------------------
def _ctx() -> Ctx:
    x = S.TRACE.ctx
    assert x is not None
    return x


def _msg(kind: Any, epoch: Any, idx: Any = 0, inc: Any = 0) -> S.SymMsg:
    if not isinstance(kind, int):
        raise S.TraceError("a message of symbolic kind")
    return S.SymMsg(kind, epoch, idx, inc)


# a code's parts, concrete (``_symbolic`` rebinds spec.state's own names while tracing)
_CODE_PARTS = (state.msg_kind, state.msg_epoch, state.msg_idx, state.msg_inc)


def _as_msg(code: Any) -> S.SymMsg:
    if isinstance(code, S.SymMsg):
        return code
    if isinstance(code, int):
        return S.SymMsg(*(f(code) for f in _CODE_PARTS))
    raise S.TraceError(f"not a message: {code!r}")


def _op(op: str, code: Any) -> NetOp:
    m = _as_msg(code)
    return NetOp(op, m.kind, S.raw(m.e), S.raw(m.i), inc=S.raw(m.inc))


def _send(w: World, net: S.SymNet, code: Any) -> S.SymNet:
    """``spec.common.send``: a control message carries its sender's incarnation."""
    m = _as_msg(code)
    if m.kind not in CHUNKS:
        m = S.SymMsg(m.kind, m.e, m.i, w.d_inc if m.kind in state.TO_PREFILL else w.p_inc)
    return net.then(_op("send", m))


def _take(net: S.SymNet, code: Any) -> S.SymNet:
    return net.then(_op("take", code))


def _add(net: S.SymNet, code: Any) -> S.SymNet:
    return net.then(_op("add", code))


def _drop(net: S.SymNet, epoch: Any) -> S.SymNet:
    return net.then(NetOp("drop", e=S.raw(epoch)))


def _in_flight(r: Req, epoch: Any, idx: Any = None) -> Any:
    net: S.SymNet = r.net  # type: ignore[assignment]
    if net.ops:
        raise S.TraceError("chunks_in_flight after a change to the messages")
    e = S.raw(epoch)
    if idx is None:
        return S.lift(z3.Not(S.raw(net.view.no_chunks(e))))
    return S.lift(O(*(net.view.count(k, e, S.raw(idx)) != 0 for k in sorted(CHUNKS))))


def _pool(name: str) -> Callable[..., Any]:
    def f(w: World, c: Any) -> Any:
        return S.lift(getattr(_ctx(), name)())

    return f


_LANDED = (common.landed_at, common.landed_chunks)  # concrete: a successor's landed = 0


def _landed_at(r: Req, idx: Any) -> Any:
    v: Any = r.landed
    return v.at(idx) if isinstance(v, S.Landed) else _LANDED[0](r, idx)


def _landed_chunks(r: Req) -> Any:
    v: Any = r.landed
    return v.chunks() if isinstance(v, S.Landed) else _LANDED[1](r)


def _slot_free(w: World, c: Any) -> Any:
    return True if not c.slots else S.lift(_ctx().slot_free())


_SYMBOLIC: dict[Any, Any] = {
    state.msg: _msg,
    state.msg_kind: lambda code: code.kind if isinstance(code, S.KindOf) else _as_msg(code).kind,
    state.msg_epoch: lambda code: _as_msg(code).e,
    state.msg_idx: lambda code: _as_msg(code).i,
    state.msg_inc: lambda code: _as_msg(code).inc,
    common.send: _send,
    common.take: _take,
    common.add: _add,
    common.drop_chunks: _drop,
    common.chunks_in_flight: _in_flight,
    common.used_p: _pool("used_p"),
    common.used_h: _pool("used_h"),
    common.used_d: _pool("used_d"),
    common.admit_possible: _pool("admit_possible"),
    common.prefix_refs: lambda w: S.lift(_ctx().refs()),
    properties.pools_recounted: lambda w, c: True,  # the domains count pools by replicas
    host_cache.host_pins: lambda w: S.lift(_ctx().host_pins()),
    common.full_chunks: lambda c, hit: S.Full(hit),
    common.full_ranks: lambda c: S.Full(None),
    common.landed_at: _landed_at,
    common.landed_chunks: _landed_chunks,
    slots.slot_free: _slot_free,
    decode_ranks.all_dst_ranks: lambda c: S.lift(c.dst_full),
    steps.changed: lambda pre, post: list(zip(pre.reqs, post.reqs, strict=True)),
}
_SITES: list[tuple[Any, str, Any]] | None = None  # (module, name, concrete fn)
_SITES_AT = 0  # len(sys.modules) when _SITES was found: a spec module imported since counts


def _sites() -> list[tuple[Any, str, Any]]:
    global _SITES, _SITES_AT
    if _SITES is None or _SITES_AT != len(sys.modules):
        _SITES_AT = len(sys.modules)
        by_id = {id(k): k for k in _SYMBOLIC}
        _SITES = [
            (mod, name, by_id[id(v)])
            for mname, mod in sorted(sys.modules.items())
            if mod is not None and (mname == "spec" or mname.startswith("spec."))
            for name, v in list(vars(mod).items())
            if id(v) in by_id
        ]
    return _SITES


@contextmanager
def _symbolic(x: Ctx) -> Iterator[None]:
    sites = _sites()
    S.TRACE.ctx = x
    for mod, name, fn in sites:
        setattr(mod, name, _SYMBOLIC[fn])
    try:
        yield
    finally:
        for mod, name, fn in sites:
            setattr(mod, name, fn)
        S.TRACE.ctx = None


# -- the symbolic config and world ---------------------------------------------------------
class _Kinds:
    def __init__(self, kinds: dict[str, Any]) -> None:
        self.kinds = kinds

    def __contains__(self, k: str) -> bool:
        return bool(S.lift(self.kinds.get(k, False)))


class SymConfig:
    """A ``Config`` read through ``Params`` (terms where the domain has them); the
    switches the encodings leave out read as their defaults (off)."""

    def __init__(self, x: Ctx) -> None:
        self._p = x.c

    def __getattr__(self, name: str) -> Any:
        if name == "fault_kinds":
            return _Kinds(self._p.fault_kinds)
        if name in self._p.__dataclass_fields__:
            return S.lift(getattr(self._p, name))
        if name == "dst_tp":
            raise S.TraceError("Config.dst_tp read (the encodings have dst_full)")
        raise S.TraceError(f"config field {name!r} has no symbolic value")


_WORLD_FIXED: dict[str, Any] = {}
_RFIELDS = FIELDS + EXT_FIELDS
_GFIELDS = GLOBALS + EXT_GLOBALS
_REQ_FIXED = {f: Req._field_defaults[f] for f in Req._fields if f not in _RFIELDS and f != "net"}


def sym_req(r: RV) -> Req:
    """A ``Req`` of stand-ins for the request view ``r``."""
    vals = S.req_values(r)
    fields: dict[str, Any] = {**_REQ_FIXED, **{f: vals[f] for f in _RFIELDS}}
    fields["net"] = S.SymNet(r.net)
    return Req(**fields)


def sym_world(x: Ctx, reqs: tuple[Any, ...]) -> World:
    """A ``World`` of stand-ins: the ``Ctx``'s globals, the given requests."""
    glob: dict[str, Any] = {g: S.lift(getattr(x, g)) for g in _GFIELDS}
    return World(reqs=reqs, **glob, **_WORLD_FIXED)


def _unwrap(x: Ctx, f: str, v: Any) -> Any:
    if isinstance(v, (S.Landed, S.RMask)):
        return v.t
    if f == "landed" and isinstance(v, int):
        return x.lempty() if v == 0 else _bad(f, v)
    if f == "rmask" and isinstance(v, int):
        return x.rzero() if v == 0 else _bad(f, v)
    if isinstance(v, (S.Sym, S.SymBool)):
        return v.t
    if isinstance(v, (int, bool)):
        return v
    return _bad(f, v)


def _bad(f: str, v: Any) -> Any:
    raise S.TraceError(f"field {f} set to {v!r}")


def _changed(x: Ctx, names: tuple[str, ...], old: Any, new: Any, held: Any) -> dict[str, Any]:
    """The fields of ``names`` that ``new`` changes from ``old``; a field the domain
    keeps at a constant (``held`` has no term for it) may only be set to that constant."""
    out: dict[str, Any] = {}
    for f in names:
        v, v0 = getattr(new, f), getattr(old, f)
        if v is v0:
            continue
        if f in EXT_FIELDS or f in EXT_GLOBALS:
            const = getattr(held, f)
            if not isinstance(const, z3.ExprRef):
                if isinstance(v, (int, bool)) and v == const:
                    continue
                raise S.TraceError(f"the successor sets {f}, which this encoding leaves out")
        out[f] = _unwrap(x, f, v)
    return out


def _fixed(w: World, r: Any) -> None:
    for f, v in _WORLD_FIXED.items():
        if getattr(w, f) != v:
            raise S.TraceError(f"the successor sets {f}, which the encodings leave out")
    for f, v in _REQ_FIXED.items():
        if r is not None and getattr(r, f) != v:
            raise S.TraceError(f"the successor sets {f}, which the encodings leave out")


def _effect(x: Ctx, w0: World, w: World, views: tuple[Any, ...], at: int) -> Go:
    """``w0`` to ``w`` as a ``Go`` of the acting request (slot ``at`` of ``views``: the
    world's requests, None where the ``Ctx`` summarises them); others' in ``Go.others``."""
    last: Any = w.reqs[-1]
    if len(w.reqs) != len(w0.reqs) or (last is S.OTHERS) != (views[-1] is None):
        raise S.TraceError("the successor changes another request")
    glob = _changed(x, _GFIELDS, w0, w, x)
    gos: dict[int, Go] = {}
    for j, (r0, r, view) in enumerate(zip(w0.reqs, w.reqs, views, strict=True)):
        if view is None:
            continue
        _fixed(w, r)
        net = r.net
        if not isinstance(net, S.SymNet):
            raise S.TraceError("messages not built by spec.common's helpers")
        gos[j] = Go(_changed(x, _RFIELDS, r0, r, view), {}, net.ops)
    if not gos:
        _fixed(w, None)
        return Go({}, glob, ())
    me = gos.pop(at)
    return Go(me.req, glob, me.net, {j: g for j, g in gos.items() if g.req or g.net})


def _k(v: Any) -> Any:
    return ("z", v.get_id()) if isinstance(v, z3.AstRef) else ("v", type(v), v)


_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, tuple[Rules, Any]]] = weakref.WeakKeyDictionary()


def _cache_key(name: str, x: Ctx, r: RV | None, a: Msg | None) -> tuple[Any, Any] | None:
    """A finite encoding's trace is a function of the input terms (kept alive with the
    entry, so their ids stay theirs): ``(owner, key)``, or None where it is not."""
    enc = getattr(x, "enc", None)
    net = getattr(r, "net", None) if r is not None else None
    if enc is None or (r is not None and getattr(net, "enc", None) is not enc):
        return None
    ins = [getattr(x, g) for g in _GFIELDS]
    if r is not None:
        ins += [getattr(r, f) for f in _RFIELDS]
    msg_in = () if a is None else (a.kind, _k(a.e), _k(a.i), _k(a.inc))
    net_in = () if net is None else (net.s.tag, net.i)
    return enc, (name, x.m, msg_in, net_in, tuple(_k(v) for v in ins), ins)


def trace(name: str, x: Ctx, r: RV | None, a: Msg | None = None) -> Rules:
    """The ``Rules`` of spec action ``name`` for the acting request ``r`` (slot 0 of a
    world whose other requests the ``Ctx`` summarises; None for a global action),
    consuming message ``a``. Cached per finite encoding and input terms."""
    ck = _cache_key(name, x, r, a)
    if ck is None:
        return _trace(name, x, r, a)
    owner, (*key, ins) = ck
    memo = _CACHE.setdefault(owner, {})
    hit = memo.get(tuple(key))
    if hit is None:
        hit = memo[tuple(key)] = (_trace(name, x, r, a), ins)
    return hit[0]


def _trace(name: str, x: Ctx, r: RV | None, a: Msg | None) -> Rules:
    """``r`` in slot 0, the others summarised by the ``Ctx``; where the action reads
    another (``OtherRead``), on every request of ``Ctx.views``, ``r`` at its own slot."""
    try:
        return _trace_on(name, x, (None,) if r is None else (r, None), 0, a)
    except S.OtherRead:
        views, at = x.views(), getattr(getattr(r, "net", None), "i", None)
        if r is None or views is None or not isinstance(at, int):
            raise
        return _trace_on(name, x, tuple(r if j == at else v for j, v in enumerate(views)), at, a)


def _trace_on(name: str, x: Ctx, views: tuple[Any, ...], at: int, a: Msg | None) -> Rules:
    _EQ_MEMO.clear()
    fn = ACTIONS[name].fn
    rules = Rules(name, disjoint=True)
    with _symbolic(x):
        w0 = sym_world(x, tuple(S.OTHERS if v is None else sym_req(v) for v in views))
        c = SymConfig(x)
        arg: Any = 0 if a is None else S.SymMsg(a.kind, S.lift(a.e), S.lift(a.i), S.lift(a.inc))
        m = x.m
        for lits, out in paths(lambda: fn(w0, c, m, at, arg)):  # type: ignore[arg-type]
            cond = A(*lits)
            if out is None or cond is False:
                continue
            if isinstance(out, Refused):
                if out.prop is not None:
                    rules.branches.append(Branch(cond, f"refuse {out.prop}", None))
                continue
            rules.branches.append(Branch(cond, "go", _effect(x, w0, out, views, at)))
    return rules


def traced(name: str) -> Callable[[Ctx, RV, Msg | None], Rules]:
    """``name``'s traced ``Rules`` function."""

    def fn(x: Ctx, r: RV, a: Msg | None) -> Rules:
        return trace(name, x, r, a)

    fn.__name__ = name
    return fn


def traced_global(name: str) -> Callable[[Ctx], Rules]:
    """The traced ``Rules`` function of global action ``name`` (no request)."""

    def fn(x: Ctx) -> Rules:
        return trace(name, x, None)

    fn.__name__ = name
    return fn
