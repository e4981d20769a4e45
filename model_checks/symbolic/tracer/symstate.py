"""Symbolic stand-ins for the spec's values, so that its Python actions can be traced.

``trace.py`` runs a spec action on a ``World`` whose fields are these (a real ``World``
and ``Req``: the NamedTuples hold any value). A field read from a ``Ctx``/``RV`` term is
a ``Sym`` (or a ``SymBool``); Python ints and bools stay as they are, so a concrete
config and the encoding's pinned fields fold away as the action runs.

- ``Sym``: an integer or bit-vector term. Arithmetic gives a ``Sym``; a comparison a
  ``SymBool``; ``bool(Sym)`` is ``term != 0``.
- ``SymBool``: ``bool()`` asks the tracer's path oracle (``Oracle.decide``), which
  answers from the path being replayed and queues the other side.
- ``SymMsg``: a message code of concrete kind (``msg``/``msg_kind``... of the spec are
  replaced by ``trace.py`` while an action runs); ``SymNet``: a request's messages, the
  view it started from and the ``NetOp`` list done to it since (take, send, drop).
- ``Landed``/``RMask``: the ``landed`` and ``rmask`` fields, whose set operations go to
  the ``Ctx`` (``ladd``, ``lfull``, ``lhas``, ``rbit``); ``Bit``/``Full``: ``1 << idx`` and
  ``full_chunks``/``full_ranks``, which only those two take.

Anything the tracer cannot follow (a symbolic value as a dict key, iterating a
``SymNet``, another request read) raises ``TraceError`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from model_checks.symbolic.core import RV, Ctx, N, NetOp, NetView, Z


class TraceError(Exception):
    """The spec did something the tracer cannot follow symbolically."""


Decide = Callable[[Any], bool]


class _Path:
    """The oracle of the path being traced (set by ``trace.py``)."""

    decide: Decide | None = None


PATH = _Path()


def _decide(t: Any) -> bool:
    if z3.is_true(t):
        return True
    if z3.is_false(t):
        return False
    if PATH.decide is None:
        raise TraceError("a symbolic branch outside a trace")
    return PATH.decide(t)


def raw(v: Any) -> Z:
    """The z3 term (or Python value) a stand-in holds."""
    if isinstance(v, (Sym, SymBool)):
        return v.t
    return v


def lift(v: Any) -> Any:
    """A z3 term as a stand-in; Python values stay as they are."""
    if isinstance(v, z3.BoolRef):
        return True if z3.is_true(v) else False if z3.is_false(v) else SymBool(v)
    if isinstance(v, z3.ExprRef):
        return Sym(v)
    return v


def _bin(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def f(a: Any, b: Any) -> Any:
        if isinstance(b, (Landed, RMask, Bit, Full, SymNet, SymMsg)):
            return NotImplemented
        return lift(op(raw(a), raw(b)))

    return f


def _rbin(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def f(a: Any, b: Any) -> Any:
        return lift(op(raw(b), raw(a)))

    return f


class SymBool:
    __slots__ = ("t",)

    def __init__(self, t: Any) -> None:
        self.t = t

    def __bool__(self) -> bool:
        return _decide(self.t)

    def __hash__(self) -> int:
        raise TraceError("a symbolic value used as a dict key or set member")

    def __eq__(self, o: object) -> Any:
        return lift(raw(self) == raw(o))

    def __ne__(self, o: object) -> Any:
        return lift(raw(self) != raw(o))

    def __repr__(self) -> str:
        return f"SymBool({self.t})"


class Sym:
    """An integer or bit-vector term."""

    __slots__ = ("t",)

    def __init__(self, t: Any) -> None:
        self.t = t

    def __bool__(self) -> bool:
        return _decide(self.t != 0)

    def __hash__(self) -> int:
        raise TraceError("a symbolic value used as a dict key or set member")

    def __index__(self) -> int:
        raise TraceError("a symbolic value used as a Python int (an index, a range)")

    def __repr__(self) -> str:
        return f"Sym({self.t})"

    __add__ = _bin(lambda a, b: a + b)
    __sub__ = _bin(lambda a, b: a - b)
    __mul__ = _bin(lambda a, b: a * b)
    __and__ = _bin(lambda a, b: a & b)
    __or__ = _bin(lambda a, b: a | b)
    __xor__ = _bin(lambda a, b: a ^ b)
    __lt__ = _bin(lambda a, b: a < b)
    __le__ = _bin(lambda a, b: a <= b)
    __gt__ = _bin(lambda a, b: a > b)
    __ge__ = _bin(lambda a, b: a >= b)
    __eq__ = _bin(lambda a, b: a == b)
    __ne__ = _bin(lambda a, b: a != b)
    __radd__ = _rbin(lambda a, b: a + b)
    __rsub__ = _rbin(lambda a, b: a - b)
    __rmul__ = _rbin(lambda a, b: a * b)
    __rand__ = _rbin(lambda a, b: a & b)
    __ror__ = _rbin(lambda a, b: a | b)

    def __invert__(self) -> Any:
        if not z3.is_bv(self.t):
            raise TraceError("~ of a symbolic integer (only flag words)")
        return Sym(~self.t)

    def __rlshift__(self, one: Any) -> Bit:
        if one != 1:
            raise TraceError("a shift of a symbolic amount other than 1 << idx")
        return Bit(self)

    def __divmod__(self, q: Any) -> tuple[Any, Any]:
        """Forks over the concrete quotients ``0..DIVMOD_MAX`` (a rank)."""
        for k in range(DIVMOD_MAX):
            if k * q <= self < (k + 1) * q:
                return k, self - k * q
        raise Infeasible("divmod outside the ranks (outside TypeOK)")


DIVMOD_MAX = 4  # Config.src_tp <= 4


class Infeasible(Exception):
    """This path leaves TypeOK: it contributes no branch (as the hand mirror did)."""


@dataclass(frozen=True)
class Bit:
    """``1 << idx``: a member of ``landed`` or ``rmask``."""

    idx: Any


@dataclass(frozen=True)
class Full:
    """``full_chunks(c, hit)`` (``hit`` given) or ``full_ranks(c)`` (``hit`` None)."""

    hit: Any


def _bit(b: Any) -> Bit | None:
    """``b`` as a ``Bit``: one already, or a Python power of two."""
    if isinstance(b, Bit):
        return b
    if isinstance(b, int) and b > 0 and b & (b - 1) == 0:
        return Bit(b.bit_length() - 1)
    return None


def _ctx() -> Ctx:
    if TRACE.ctx is None:
        raise TraceError("no trace context")
    return TRACE.ctx


class _Trace:
    ctx: Ctx | None = None
    kinds: bool = False  # a worker action is traced: its messages iterate by kind


TRACE = _Trace()


class Landed:
    """The set of landed chunk indices (``Req.landed``)."""

    __slots__ = ("t",)

    def __init__(self, t: Any) -> None:
        self.t = t

    def __or__(self, b: Any) -> Landed:
        if (bit := _bit(b)) is not None:
            return Landed(_ctx().ladd(self.t, raw(bit.idx)))
        if isinstance(b, int) and b == 0:
            return self
        raise TraceError("landed | something other than 1 << idx")

    def _full(self, o: Any) -> Any:
        if isinstance(o, Landed):  # two states' sets (a transition predicate)
            return self.t == o.t
        if not isinstance(o, Full) or o.hit is None:
            raise TraceError("landed compared with something other than full_chunks")
        return _ctx().lfull(self.t, raw(o.hit))

    def __eq__(self, o: object) -> Any:
        return lift(self._full(o))

    def __ne__(self, o: object) -> Any:
        return lift(z3.Not(self._full(o)))

    def __invert__(self) -> Any:
        raise TraceError("~landed (a set difference of landed chunks)")

    def __hash__(self) -> int:
        raise TraceError("landed used as a dict key")

    def __bool__(self) -> bool:
        raise TraceError("landed used as a truth value")

    def at(self, idx: Any) -> Any:
        """``spec.common.landed_at``: chunk ``idx`` landed."""
        return lift(_ctx().lhas(self.t, raw(idx)))

    def chunks(self) -> list[Any]:
        """``spec.common.landed_chunks``: only a conjunct's slot scope (``SlotLanded``)."""
        raise TraceError("the landed chunks iterated (only in a conjunct's slot scope)")


class SlotLanded(Landed):
    """``landed`` as a slot conjunct sees it: its landed chunks are the slot's index
    (where it landed) or none (``idx`` None: the request's scope)."""

    __slots__ = ("idx",)

    def __init__(self, t: Any, idx: Any) -> None:
        super().__init__(t)
        self.idx = idx

    def chunks(self) -> list[Any]:
        return [] if self.idx is None or not self.at(self.idx) else [lift(self.idx)]


class RMask:
    """The source ranks whose RankDone decode received (``Req.rmask``)."""

    __slots__ = ("t",)

    def __init__(self, t: Any) -> None:
        self.t = t

    def __or__(self, b: Any) -> RMask:
        if (bit := _bit(b)) is not None:
            return RMask(self.t | _ctx().rbit(raw(bit.idx)))
        raise TraceError("rmask | something other than 1 << rank")

    def __and__(self, b: Any) -> Any:
        if (bit := _bit(b)) is not None:
            return lift(self.t & _ctx().rbit(raw(bit.idx)))
        raise TraceError("rmask & something other than 1 << rank")

    def _full(self, o: Any) -> Any:
        if isinstance(o, RMask):  # two states' masks (a transition predicate)
            return self.t == o.t
        if isinstance(o, Full) and o.hit is None:
            return self.t == _ctx().rfull()
        if isinstance(o, int) and o == 0:
            return self.t == _ctx().rzero()
        raise TraceError("rmask compared with something other than full_ranks or 0")

    def __eq__(self, o: object) -> Any:
        return lift(self._full(o))

    def __ne__(self, o: object) -> Any:
        return lift(z3.Not(self._full(o)))

    def __invert__(self) -> Any:
        raise TraceError("~rmask (a set difference of ranks)")

    def __hash__(self) -> int:
        raise TraceError("rmask used as a dict key")

    def __bool__(self) -> bool:
        return _decide(self.t != _ctx().rzero())


@dataclass(frozen=True)
class SymMsg:
    """A message code: concrete kind, epoch, index and incarnation terms."""

    kind: int
    e: Any
    i: Any = 0
    inc: Any = 0

    def __hash__(self) -> int:
        raise TraceError("a symbolic message used as a dict key")


class SymNet:
    """A request's messages: the starting view and the ops applied since, in order."""

    __slots__ = ("view", "ops")

    def __init__(self, view: NetView, ops: tuple[NetOp, ...] = ()) -> None:
        self.view, self.ops = view, ops

    def then(self, op: NetOp) -> SymNet:
        return SymNet(self.view, (*self.ops, op))

    def __iter__(self) -> Any:
        """Only a filter by kind of the messages as they were (a worker's crash keeps
        those of some kinds): one ``KindOf`` stand-in per message kind."""
        if self.ops or not TRACE.kinds:
            raise TraceError("a request's messages iterated (only a worker's filter by kind)")
        return iter(tuple(KindOf(k, self) for k in range(16)))

    def __bool__(self) -> bool:
        if self.ops:
            raise TraceError("a request's messages tested after a change to them")
        return _decide(z3.Not(raw(self.view.empty())))

    def __len__(self) -> int:
        raise TraceError("a request's messages counted (use spec.common's helpers)")

    def __eq__(self, other: object) -> Any:
        """Two requests' messages as they were (a transition predicate's before/after)."""
        if not isinstance(other, SymNet) or self.ops or other.ops:
            raise TraceError("a request's messages compared after a change to them")
        return lift(self.view.same(other.view))

    def __ne__(self, other: object) -> Any:
        return lift(N(raw(self.__eq__(other))))

    def __hash__(self) -> int:
        raise TraceError("a request's messages used as a dict key")


@dataclass(frozen=True, eq=False)
class KindOf:
    """Every message of one kind of a request's messages (``SymNet.__iter__``): only its
    kind may be read; a tuple of these is the messages of the kept kinds."""

    kind: int
    net: SymNet


class OtherRead(TraceError):
    """An action read another request than the acting one: a finite encoding traces it
    again on the world of every request (``trace._trace``)."""


class Others:
    """The requests other than the acting one: read only through pool helpers."""

    def __getattr__(self, name: str) -> Any:
        raise OtherRead(f"another request's field {name!r} read (use a pool helper)")


OTHERS = Others()


def req_values(r: RV) -> dict[str, Any]:
    """The stand-in field values of a request view."""
    return {
        f: (Landed(v) if f == "landed" else RMask(v) if f == "rmask" else lift(v))
        for f in r.__dataclass_fields__
        if f != "net" and (v := getattr(r, f)) is not None
    }
