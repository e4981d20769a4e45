"""Shared vocabulary of the z3 encodings of the spec (finite and unbounded).

The spec's actions are written once, in ``spec/``; ``trace`` runs them on symbolic values
over two small interfaces defined here:

- ``RV``: a *request view*, the 20 scalar fields of one ``Req`` as z3 terms, plus a
  ``NetView`` on its in-flight messages;
- ``Ctx``: what an action may read besides its request (globals, pool usage, the
  config as ``Params``, the mutants) and the set operations on ``landed``.

An action's encoding is ``Rules``: its paths, each a condition and either a refusal (no
successor) or a ``Go`` (the fields it changes: everything else is unchanged, the
explicit frame). Traced paths exclude each other (``Rules.disjoint``); a hand-written
``Rules`` lists branches in order, the first whose condition holds deciding, and
``Rules.cases()`` turns that order into mutually exclusive guards.

Two domains implement ``Ctx``: ``encoding`` (a fixed number of requests, one count
per possible message code: BMC and the agreement test) and ``unbounded`` (requests
of an uninterpreted sort, fields as arrays, ghost counters: the induction proofs).
Python ints and bools may stand wherever a term may; the helpers below fold them, so
the finite encoding of a concrete config simplifies as it is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import z3

from model_checks.symbolic.connectives import EQ as EQ
from model_checks.symbolic.connectives import IN as IN
from model_checks.symbolic.connectives import ITE as ITE
from model_checks.symbolic.connectives import A as A
from model_checks.symbolic.connectives import N as N
from model_checks.symbolic.connectives import O as O
from model_checks.symbolic.connectives import Z as Z
from model_checks.symbolic.connectives import flag as flag
from model_checks.symbolic.connectives import same as same
from spec.config import FAULT_KINDS, Config

FIELDS: tuple[str, ...] = (
    "st",
    "p",
    "d",
    "h",
    "ep",
    "dep",
    "ps",
    "sent",
    "phit",
    "hit",
    "landed",
    "rmask",
    "rcnt",
    "dfl",
    "hl",
    "gl",
    "mv",
    "g",
    "pstep",
    "dstep",
    "dmask",
    "stg",
    "sl",
)
GLOBALS: tuple[str, ...] = ("faults", "p_up", "d_up", "pfx", "pfx_ref", "pfx_ok")
# Fields of the behaviours only some finite encodings hold as variables (the others, and
# the unbounded model, keep them at their defaults: ``RV``/``Ctx`` below): the shared host
# cache (``Config.host_cache``) and multi-turn append (``Config.turns``).
HOST_FIELDS: tuple[str, ...] = ("hk",)
HOST_GLOBALS: tuple[str, ...] = ("hc", "hc_hl", "hc_pin", "hc_late", "hc_bad")
TURN_FIELDS: tuple[str, ...] = ("tn", "ti", "tdv", "tc")
# Streamed offers (``Config.layers``, spec/stream/layers.py): the layer registers.
STREAM_FIELDS: tuple[str, ...] = ("lay", "cpy", "fs", "inl", "rdy")
# Restarts (``Config.restarts``, spec/behaviours/restarts.py): the workers' incarnations
# and the decode incarnation a request's writes target; a message code carries its own.
RESTART_FIELDS: tuple[str, ...] = ("rinc",)
RESTART_GLOBALS: tuple[str, ...] = ("p_inc", "d_inc")
WINDOW_FIELDS: tuple[str, ...] = ("pw",)  # sliding-window pruning (Config.window)
EXT_FIELDS = HOST_FIELDS + TURN_FIELDS + STREAM_FIELDS + RESTART_FIELDS + WINDOW_FIELDS
EXT_GLOBALS = HOST_GLOBALS + RESTART_GLOBALS
BV_FIELDS = {"dfl": 5, "g": 6, "dmask": 4}  # flag words (rmask and landed: width from the domain)


# -- the interfaces the actions are written against -------------------------------------
@dataclass(frozen=True)
class Msg:
    """The message an action consumes: its kind is always concrete."""

    kind: int
    e: Z
    i: Z
    inc: Z = 0  # the incarnation (spec.state.msg_inc)


@dataclass(frozen=True)
class NetOp:
    """One change to the acting request's messages, applied in order.

    ``take``: remove one copy; ``send``: add one copy if the receiving worker is up
    (``spec.common.send``); ``add``: add one copy unconditionally (a fault); ``drop``:
    every chunk (good or corrupt) of epoch ``e`` vanishes (``drop_chunks``).
    ``when``: the op happens only under this condition.
    """

    op: str
    kind: int = 0
    e: Z = 0
    i: Z = 0
    when: Z = True
    inc: Z = 0


@dataclass
class Go:
    """A successor: the changed fields of the acting request, globals, message ops."""

    req: dict[str, Z] = field(default_factory=dict)
    glob: dict[str, Z] = field(default_factory=dict)
    net: tuple[NetOp, ...] = ()
    # the other requests it changes, by slot (their fields and messages; only a finite
    # encoding's trace on every request has them: ``tracer.trace``)
    others: dict[int, Go] = field(default_factory=dict)


@dataclass
class Branch:
    cond: Z
    label: str  # "not enabled", "refuse <Prop>" or "go"
    go: Go | None


class Rules:
    """An action's return statements, in order (first match wins)."""

    def __init__(self, name: str, disjoint: bool = False) -> None:
        self.name = name
        self.branches: list[Branch] = []
        self.disjoint = disjoint  # traced: the conditions exclude each other already

    def no(self, cond: Z, prop: str | None = None) -> None:
        label = f"refuse {prop}" if prop else "not enabled"
        self.branches.append(Branch(cond, label, None))

    def go(self, cond: Z = True, net: Iterable[NetOp] = (), **changes: Z) -> None:
        glob = {k: changes.pop(k) for k in GLOBALS if k in changes}
        bad = set(changes) - set(FIELDS)
        if bad:
            raise KeyError(f"{self.name}: unknown fields {sorted(bad)}")
        self.branches.append(Branch(cond, "go", Go(changes, glob, tuple(net))))

    def cases(self) -> list[tuple[Z, Go, str]]:
        """(guard, successor, label) of every branch that yields a successor; the guards
        are mutually exclusive: a branch is taken when its condition holds and no
        earlier condition does."""
        out: list[tuple[Z, Go, str]] = []
        earlier: list[Z] = []
        for k, b in enumerate(self.branches):
            if b.cond is False:
                continue
            if b.go is not None:
                prior = () if self.disjoint else (N(x) for x in earlier)
                out.append((A(b.cond, *prior), b.go, f"{self.name}#{k}"))
            if b.cond is True:
                break
            earlier.append(b.cond)
        return out

    def enabled(self) -> Z:
        return O(*(g for g, _, _ in self.cases()))


class NetView:
    """The in-flight messages of one request (domain-specific)."""

    def count(self, kind: int, e: Z, i: Z) -> Z:
        raise NotImplementedError

    def no_chunks(self, e: Z) -> Z:
        """No chunk (good or corrupt) of epoch ``e`` in flight (not ``chunks_in_flight``)."""
        raise NotImplementedError

    def empty(self) -> Z:
        """No message of the request in flight at all (``not r.net``)."""
        raise NotImplementedError

    def same(self, other: NetView) -> Z:
        """The same messages in flight as ``other`` (``a.net == b.net``, two states)."""
        raise NotImplementedError


@dataclass
class RV:
    """A request view: the fields of one ``Req`` as terms, and its messages."""

    st: Z
    p: Z
    d: Z
    h: Z
    ep: Z
    dep: Z
    ps: Z
    sent: Z
    phit: Z
    hit: Z
    landed: Z
    rmask: Z
    rcnt: Z
    dfl: Z
    hl: Z
    gl: Z
    mv: Z
    g: Z
    stg: Z
    sl: Z
    net: NetView
    pstep: Z = 0  # async steps (spec/behaviours/async_steps): a step in flight on prefill
    dstep: Z = 0  # ... and on decode
    dmask: Z = 0
    hk: Z = 0  # the shared host cache (EXT_FIELDS: variables where the encoding holds them)
    tn: Z = 0  # multi-turn append
    ti: Z = 0
    tdv: Z = 0
    tc: Z = 0
    lay: Z = 0  # streamed offers (spec/stream/layers.py)
    cpy: Z = 0
    fs: Z = 0
    inl: Z = 0
    rdy: Z = 0
    rinc: Z = 0  # restarts
    pw: Z = 0  # sliding-window pruning (spec/window/__init__.py)

    def get(self, f: str) -> Z:
        return getattr(self, f)


@dataclass
class Params:
    """A config's bounds as terms: Python values (finite) or z3 constants (unbounded)."""

    blocks: Z
    src_tp: int  # always concrete: chunk indices are rank * per_rank + pos
    cap_p: Z
    cap_d: Z
    cap_h: Z
    prefix: Z
    handoff: Z
    offload: Z
    recompute: Z
    cancel: Z
    faults: Z
    max_attempts: Z
    max_moves: Z
    fault_kinds: dict[str, Z]
    async_steps: Z = False
    revocable: Z = True  # spec/behaviours/irrevocable.py
    decode_failure: Z = False  # spec/behaviours/decode_failure.py
    retract: Z = False  # spec/behaviours/retract.py
    decode_ranks: Z = False  # spec/behaviours/decode_ranks.py
    dst_full: Z = 0  # the mask of every decode rank (0 without decode_ranks)
    identity: Z = False  # Config.identity (spec/behaviours/identity.py)
    slots: Z = False  # Config.slots (spec/behaviours/slots.py)
    host_cache: Z = 0  # Config.host_cache (spec/behaviours/host_cache.py)
    turns: Z = False  # Config.turns (spec/behaviours/turns.py)
    max_turns: Z = 1
    layers: Z = 0  # Config.layers (spec/stream/layers.py)
    restarts: Z = 0  # Config.restarts (spec/behaviours/restarts.py)
    window: Z = False  # Config.window (spec/window/__init__.py)

    @staticmethod
    def of(c: Config) -> Params:
        return Params(
            blocks=c.blocks,
            src_tp=c.src_tp,
            cap_p=c.cap_p,
            cap_d=c.cap_d,
            cap_h=c.cap_h,
            prefix=c.prefix,
            handoff=c.handoff,
            offload=c.offload,
            recompute=c.recompute,
            cancel=c.cancel,
            faults=c.faults,
            max_attempts=c.max_attempts,
            max_moves=c.max_moves,
            fault_kinds={k: k in c.fault_kinds for k in sorted(FAULT_KINDS)},
            async_steps=c.async_steps,
            revocable=c.revocable,
            decode_failure=c.decode_failure,
            retract=c.retract,
            decode_ranks=c.decode_ranks,
            dst_full=(1 << c.dst_tp) - 1 if c.decode_ranks else 0,
            identity=c.identity,
            slots=c.slots,
            host_cache=c.host_cache,
            turns=c.turns,
            max_turns=c.max_turns,
            layers=c.layers,
            restarts=c.restarts,
            window=c.window,
        )


class Ctx:
    """What an action reads besides its own request (domain-specific parts abstract)."""

    c: Params
    m: frozenset[str]
    faults: Z
    p_up: Z
    d_up: Z
    pfx: Z
    pfx_ref: Z
    pfx_ok: Z = True
    hc: Z = 0  # HOST_GLOBALS: the shared host cache's copy (NONE), its blocks, pins...
    hc_hl: Z = 0
    hc_pin: Z = 0
    hc_late: Z = 0
    hc_bad: Z = False
    p_inc: Z = 0  # RESTART_GLOBALS: the workers' incarnations
    d_inc: Z = 0

    def views(self) -> list[RV] | None:
        """Every request's view, where the domain has a fixed number (None: unbounded)."""
        return None

    def num(self, v: Z) -> Z:
        """A number in the domain's scalar sort (a Python int is lifted)."""
        return v

    def used_p(self) -> Z:
        raise NotImplementedError

    def used_h(self) -> Z:
        raise NotImplementedError

    def used_d(self) -> Z:
        raise NotImplementedError

    def refs(self) -> Z:
        """Requests holding a reference to the shared prefix (decode replica, hit > 0)."""
        raise NotImplementedError

    def host_pins(self) -> Z:
        """Requests pinning the shared host copy (``host_cache.host_pins``): none where
        the domain holds no host-cache fields (they keep their defaults)."""
        return 0

    def admit_possible(self) -> Z:
        raise NotImplementedError

    def slot_free(self) -> Z:
        """No request holds decode's metadata slot (``spec.behaviours.slots.slot_free``
        without its config test)."""
        raise NotImplementedError

    # ``landed``: the set of chunk indices that landed
    def lempty(self) -> Z:
        raise NotImplementedError

    def ladd(self, s: Z, idx: Z) -> Z:
        raise NotImplementedError

    def lfull(self, s: Z, hit: Z) -> Z:
        """``s == full_chunks(c, hit)``: every chunk index below src_tp*(blocks-hit)."""
        raise NotImplementedError

    def lhas(self, s: Z, idx: Z) -> Z:
        """``idx`` is in ``s`` (``spec.common.landed_at``): an array's select (the unbounded
        model's; the finite encodings' bitmaps are read by no traced predicate)."""
        return s[idx]

    # ``rmask``: a bit-vector of src_tp bits in both domains
    def rzero(self) -> Z:
        return z3.BitVecVal(0, self.c.src_tp)

    def rfull(self) -> Z:
        return z3.BitVecVal((1 << self.c.src_tp) - 1, self.c.src_tp)

    def rbit(self, idx: Z) -> Z:
        t = self.c.src_tp
        if isinstance(idx, int):
            return z3.BitVecVal((1 << idx) & ((1 << t) - 1), t)
        out: Z = z3.BitVecVal(0, t)
        for k in reversed(range(t)):
            out = z3.If(idx == k, z3.BitVecVal(1 << k, t), out)
        return out
