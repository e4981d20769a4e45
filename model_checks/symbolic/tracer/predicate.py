"""Spec predicates traced to z3 terms (the predicate tracer).

A predicate of ``spec/`` (a property's part, ``(w, c) -> bool`` or ``(w, r) -> bool``)
runs on a ``World`` of ``symstate`` stand-ins, once per path (``oracle.paths``); its
value is the disjunction over the paths of the path's condition and what the path
returned (a Python bool or a symbolic one). The world holds the requests given: one
(a request's part, ``per_req``), every request of a finite encoding (``over_reqs``), or
none. Where the domain has no fixed requests (the unbounded model) a part over every
request is traced on none, which is sound only where it folds to True (the behaviour's
fields are constants there): otherwise it fails loudly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import z3

from model_checks.symbolic.core import RV, A, Ctx, N, O, Z
from model_checks.symbolic.tracer import symstate as S
from model_checks.symbolic.tracer.oracle import _EQ_MEMO, paths
from model_checks.symbolic.tracer.trace import SymConfig, _symbolic, sym_req, sym_world

__all__ = [
    "conj_glob",
    "conj_req",
    "conj_slot",
    "over_reqs",
    "per_req",
    "req_of",
    "step_part",
    "step_part_at",
    "traced_pred",
]

WorldPred = Callable[[Any, Any], Any]  # spec: (World, Config) -> bool
ReqPred = Callable[[Any, Any], Any]  # spec: (World, Req) -> bool


def traced_pred(run: Callable[[], Any], x: Ctx) -> Z:
    """The value of ``run()`` (a predicate applied to stand-ins) as one term."""
    _EQ_MEMO.clear()
    out = []
    with _symbolic(x):
        for lits, v in paths(run):
            if v is None:  # a path outside TypeOK
                continue
            if not isinstance(v, (bool, S.SymBool)):
                raise S.TraceError(f"a predicate returned {v!r}")
            out.append(A(*lits, S.raw(v)))
    return O(*out)


def _world_pred(fn: WorldPred, x: Ctx, views: tuple[RV, ...]) -> Z:
    w = sym_world(x, tuple(sym_req(r) for r in views))
    c = SymConfig(x)
    return traced_pred(lambda: fn(w, c), x)


def per_req(fn: WorldPred) -> Callable[[Ctx, RV], Z]:
    """A request's part of ``fn`` (a predicate ``all(... for r in w.reqs)``): ``fn`` on
    the world of that one request."""
    return lambda x, r: _world_pred(fn, x, (r,))


def req_of(fn: ReqPred) -> Callable[[Ctx, RV], Z]:
    """``fn(w, r)`` for the request ``r`` (the world holding only it)."""

    def f(x: Ctx, r: RV) -> Z:
        w = sym_world(x, (sym_req(r),))
        return traced_pred(lambda: fn(w, w.reqs[0]), x)

    return f


def over_reqs(fn: WorldPred) -> Callable[[Ctx], Z]:
    """``fn`` on the world of every request (a global part: a count over the requests)."""

    def f(x: Ctx) -> Z:
        views = x.views()
        t = _world_pred(fn, x, tuple(views) if views is not None else ())
        if views is None and t is not True:
            raise S.TraceError(f"{fn.__name__}: a part over every request, unbounded")
        return t

    return f


# -- transition predicates (spec/steps.py) that read state only ---------------------------
class ActionRead(S.TraceError):
    """A transition predicate read the action (its name, slot or argument): not a
    predicate of the two states alone, so not traced here."""


class _Action:
    """The action of a step, as a traced transition predicate sees it: unreadable."""

    def _no(self, *_: Any) -> Any:
        raise ActionRead("a transition predicate read its action")

    __eq__ = __ne__ = __hash__ = __index__ = __bool__ = __contains__ = _no
    __lt__ = __le__ = __gt__ = __ge__ = __and__ = __rshift__ = __int__ = _no


_ACTION = _Action()


def step_part(fn: Any) -> Callable[[Ctx, Ctx], Z]:
    """``fn(pre, name, i, arg, post, c)`` (a predicate of ``spec/steps.py``) as a term over
    two states of a finite encoding (``x0`` before, ``x1`` after), its requests paired
    by slot; it raises ``ActionRead`` where it reads the action. ``steps.changed`` pairs
    every request: a request the step left alone is the same before and after, where
    the predicates hold (they judge what a step changes)."""

    return step_part_at(fn, _ACTION, _ACTION, _ACTION)


def step_part_at(fn: Any, name: Any, i: Any, arg: Any) -> Callable[[Ctx, Ctx], Z]:
    """``step_part`` for one action instance (``name``, slot ``i``, argument ``arg``,
    concrete): the predicates that read the action (``stale_changes_nothing``: a
    message of an older epoch or incarnation changes nothing) judged for that step."""

    def f(x0: Ctx, x1: Ctx) -> Z:
        v0, v1 = x0.views(), x1.views()
        if v0 is None or v1 is None:
            raise S.TraceError("a transition predicate needs a finite encoding")
        pre = sym_world(x0, tuple(sym_req(r) for r in v0))
        post = sym_world(x1, tuple(sym_req(r) for r in v1))
        c = SymConfig(x1)
        return traced_pred(lambda: fn(pre, name, i, arg, post, c), x1)

    return f


# -- a safety property's scopes (props.ZProp), traced from its spec predicate --------------
class _Messages:
    """A request's messages as a traced safety predicate sees them: the given ones (none,
    or one message of concrete kind with the scope's epoch and index). ``read``: the
    predicate looked at them (on some path)."""

    __slots__ = ("msgs", "read")

    def __init__(self, msgs: tuple[S.SymMsg, ...]) -> None:
        self.msgs, self.read = msgs, False

    def __iter__(self) -> Any:
        self.read = True
        return iter(self.msgs)

    def __bool__(self) -> bool:
        self.read = True
        return bool(self.msgs)

    def __len__(self) -> int:
        self.read = True
        return len(self.msgs)


def _holds(pred: WorldPred, x: Ctx, reqs: tuple[Any, ...]) -> Z:
    w = sym_world(x, reqs)
    c = SymConfig(x)
    return traced_pred(lambda: pred(w, c), x)


def _alone(r: RV, net: _Messages) -> Any:
    """The stand-in request of view ``r`` whose messages are ``net``."""
    fields: dict[str, Any] = {"net": net}
    return sym_req(r)._replace(**fields)


def prop_glob(pred: WorldPred, x: Ctx) -> Z:
    """``pred`` on a world of no request: its global part (pool usage and counts over the
    requests come from the domain through spec.common's pool helpers)."""
    return _holds(pred, x, ())


def prop_req(pred: WorldPred, x: Ctx, r: RV) -> tuple[Z, bool]:
    """``pred`` on the world of request ``r`` alone, with no message in flight, and
    whether the predicate looked at the request's messages (where it never does, no
    message can change its verdict: the ``msg`` scope is the ``req`` one)."""
    net = _Messages(())
    return _holds(pred, x, (_alone(r, net),)), net.read


def prop_msg(pred: WorldPred, x: Ctx, r: RV, kind: int, e: Z, i: Z, inc: Z = 0) -> Z:
    """``pred`` on the world of request ``r`` alone with one message in flight, of ``kind``
    with epoch ``e``, index ``i`` and incarnation ``inc``. A safety predicate is a
    conjunction over the requests and their messages (a global part read through the pool
    helpers, then per request, then per message), so the state satisfies it exactly when
    the global part, every request's part and every message's part hold
    (tests/symbolic/test_props_derived checks the split on the explored states of every
    default world)."""
    msg = S.SymMsg(kind, S.lift(e), S.lift(i), S.lift(inc))
    return _holds(pred, x, (_alone(r, _Messages((msg,))),))


# -- an INVARIANTS.md conjunct's scope (invariants.STRENGTHENING), traced from spec/invariants
def _no(*_: Any) -> Any:
    raise S.TraceError("a conjunct read its request's messages other than one by one")


class _NoMessages:
    """A request conjunct's messages: unreadable (one that reads them is a slot conjunct)."""

    __iter__ = __bool__ = __len__ = __contains__ = count = _no


class _SlotMessages:
    """The request's messages as a slot conjunct sees them: the one given (or none), of
    concrete kind at the slot; ``count`` reads the request's real count of a message."""

    __slots__ = ("msgs", "view", "read")
    __bool__ = __len__ = __contains__ = _no

    def __init__(self, view: Any, msgs: tuple[S.SymMsg, ...] = ()) -> None:
        self.view, self.msgs, self.read = view, msgs, False

    def __iter__(self) -> Any:
        self.read = True
        return iter(self.msgs)

    def count(self, code: Any) -> Any:
        if not isinstance(code, S.SymMsg):
            raise S.TraceError(f"a count of {code!r} (not spec.state.msg's)")
        return S.lift(self.view.count(code.kind, S.raw(code.e), S.raw(code.i)))


def _conj(pred: WorldPred, x: Ctx, r: RV, net: Any, landed: Any) -> list[tuple[list[Z], Any]]:
    """The paths of ``pred`` on the world of request ``r`` alone, its messages ``net``
    and its ``landed`` stand-in."""
    req = sym_req(r)._replace(net=net, landed=landed)
    w, c = sym_world(x, (req,)), SymConfig(x)
    _EQ_MEMO.clear()
    with _symbolic(x):
        return list(paths(lambda: pred(w, c)))


def _term(got: list[tuple[list[Z], Any]]) -> Z:
    """The predicate's value as the decision tree of its paths (they share prefixes: a
    fork is an ``If`` of the two sides, so what follows a fork is built once whatever
    side led there, and z3 shares the identical terms). A path that left TypeOK
    counts as False, as in ``traced_pred``."""
    for _, v in got:
        if v is not None and not isinstance(v, (bool, S.SymBool)):
            raise S.TraceError(f"a conjunct returned {v!r}")
    return _tree([(lits, False if v is None else S.raw(v)) for lits, v in got], 0)


def _tree(ps: list[tuple[list[Z], Z]], d: int) -> Z:
    if len(ps) == 1 and len(ps[0][0]) == d:
        return ps[0][1]
    lit = ps[0][0][d]
    yes = [p for p in ps if z3.eq(p[0][d], lit)]
    no = [p for p in ps if not z3.eq(p[0][d], lit)]
    if not yes or not no:
        raise S.TraceError("a fork with one side (the paths are not a tree)")
    a, b = _tree(yes, d + 1), _tree(no, d + 1)
    if a is b or (_terms(a, b) and z3.eq(a, b)):
        return a
    if a is True:
        return O(lit, b)
    if a is False:
        return A(N(lit), b)
    if b is True:
        return O(N(lit), a)
    if b is False:
        return A(lit, a)
    return z3.If(lit, a, b)


def conj_glob(pred: WorldPred) -> Callable[[Ctx], Z]:
    """A global conjunct: ``pred`` on the world of no request."""
    return lambda x: _holds(pred, x, ())


def conj_req(pred: WorldPred) -> Callable[[Ctx, RV], Z]:
    """A request conjunct (``all(... for r in w.reqs)``): ``pred`` on the world of the one
    request (so with the global part); it reads no message and no landed chunk."""
    return lambda x, r: _term(_conj(pred, x, r, _NoMessages(), S.Landed(r.landed)))


def conj_slot(pred: WorldPred, kinds: Iterable[int]) -> Callable[[Ctx, RV, Z, Z], Z]:
    """A slot conjunct at ``(e, i)``. ``pred`` is a conjunction over each request's
    messages and landed chunks: it reads no other request, and nothing outside a
    message's or a landed chunk's clause decides it (with neither, every path holds).
    So it holds at the slot where ``pred`` holds with chunk ``i`` landed (if it did) and
    no message, and, for each kind with a message in flight at the slot, with that one
    message too (``count`` reads the real counts)."""
    ks = tuple(sorted(kinds))

    def f(x: Ctx, r: RV, e: Z, i: Z) -> Z:
        empty = _conj(pred, x, r, _SlotMessages(r.net), S.SlotLanded(r.landed, None))
        if any(v is not True for _, v in empty):
            raise S.TraceError(f"{pred.__name__}: a slot conjunct with a request part")
        net = _SlotMessages(r.net)
        alone = _term(_conj(pred, x, r, net, S.SlotLanded(r.landed, i)))
        out = [alone]
        for k in ks if net.read else ():  # (a conjunct that never looks at the messages)
            m = S.SymMsg(k, S.lift(e), S.lift(i))
            t = _term(_conj(pred, x, r, _SlotMessages(r.net, (m,)), S.SlotLanded(r.landed, i)))
            if t is True or t is alone or (_terms(t, alone) and z3.eq(t, alone)):
                continue  # the message changes nothing
            out.append(O(r.net.count(k, e, i) <= 0, t))
        return A(*out)

    return f


def _terms(a: Any, b: Any) -> bool:
    return isinstance(a, z3.ExprRef) and isinstance(b, z3.ExprRef)
