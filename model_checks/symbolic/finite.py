"""The finite state of ``symbolic.encoding``: variables, message codes, and the ``Ctx`` of the
shared actions over them.

``FState``: per request the 18 ``Req`` fields and one count per possible message code,
plus the globals, all bit-vectors (``auto_bits`` wide; ``landed`` src_tp*blocks bits,
``rmask`` src_tp bits) or Booleans. ``FCtx`` sums pool usage over the requests.
``Inst`` is an action instance, the explorer's edge label; ``Sub`` a part of one whose
message codes are concrete (``pin_fields``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import z3

from model_checks.symbolic.core import EQ, GLOBALS, IN, ITE, A, Ctx, Msg, N, NetView, O, Params, Z
from spec.behaviours.host_cache import HK_PINNED
from spec.config import Config
from spec.state import (
    CHUNKS,
    M_ACK,
    M_CHUNK,
    M_CHUNK_BAD,
    M_CHUNK_UNSTAGED,
    M_DONE,
    M_HANDOFF,
    M_HANDOFF_BAD,
    M_NACK,
    M_QUIESCED,
    M_READY,
    NONE,
    PREEMPTED,
    QUEUED,
    msg,
    msg_epoch,
    msg_idx,
    msg_inc,
    msg_kind,
)


class Encoding(Protocol):
    """What the finite state reads of its encoding (``symbolic.encoding.Encoding``); a
    protocol, so that this module does not import the encoding that imports it."""

    c: Config  # the finite config
    m: frozenset[str]  # the mutants switched on
    params: Params  # the config's constants as terms
    codes: tuple[int, ...]  # the message codes this config can produce
    width: int  # bits of the ``landed`` bitmap
    fields: tuple[str, ...]  # the request fields held as variables (FIELDS + behaviours')
    globs: tuple[str, ...]  # the globals held as variables (GLOBALS + behaviours')

    def view(self, s: FState, i: int) -> Any: ...

    def field_var(self, name: str, f: str) -> Z: ...

    def num(self, v: Z) -> Z: ...

    def scalar(self, name: str) -> Z: ...


Key = tuple[Any, ...]  # ("r", slot, field) | ("n", slot, code) | ("g", name)


@dataclass(frozen=True)
class Inst:
    """One action instance: the explorer's edge label (name, request slot, argument)."""

    name: str
    i: int
    arg: int


Pins = tuple[tuple[str, Any], ...]  # (field or "pfx", value) pairs; () for all states


@dataclass(frozen=True)
class Sub:
    """An instance restricted to the states where some fields have given values (so that
    the message codes it sends are concrete); ``rest``: every other state."""

    inst: Inst
    pins: Pins = ()
    rest: tuple[Pins, ...] = ()


PIN_GLOBALS = ("pfx", "p_inc", "d_inc")  # the globals a message code may depend on


def pin_fields(enc: Encoding, s: FState, k: Inst) -> tuple[str, ...]:
    """The fields whose values decide which message codes instance ``k`` sends, takes or
    drops: the variables of ``s`` (``k``'s request, and ``pfx``) in the epochs and indices
    of the message operations of its action's traced paths, traced once unpinned."""
    from model_checks.symbolic.actions import PER_REQ
    from spec.actions import ACTIONS

    fn = PER_REQ.get(k.name)
    if fn is None:
        return ()
    m = (
        Msg(msg_kind(k.arg), msg_epoch(k.arg), msg_idx(k.arg), msg_inc(k.arg))
        if ACTIONS[k.name].arg == "msg"
        else None
    )
    ops = [op for b in fn(FCtx(enc, s), enc.view(s, k.i), m).branches if b.go for op in b.go.net]
    used: set[int] = set()
    todo = [t for op in ops for t in (op.e, op.i, op.inc, op.when) if isinstance(t, z3.ExprRef)]
    while todo:
        t = todo.pop()
        if t.num_args() == 0:
            used.add(t.get_id())
        todo.extend(t.children())
    keys: list[Key] = [("r", k.i, f) for f in enc.fields]
    keys += [("g", g) for g in PIN_GLOBALS if g in enc.globs]
    return tuple(key[-1] for key in keys if s[key].get_id() in used)


def possible_codes(c: Config) -> tuple[int, ...]:
    """Every message code that can be in flight in ``c`` (sorted)."""
    if not c.handoff:
        return ()
    out: set[int] = set()
    for e in range(1, c.max_attempts + 1):
        out |= {msg(k, e) for k in (M_HANDOFF, M_ACK, M_NACK, M_QUIESCED)}
        if "mismatch" in c.fault_kinds:
            out.add(msg(M_HANDOFF_BAD, e))
        out |= {msg(M_READY, e, 0), msg(M_READY, e, c.prefix)}
        chunk_kinds: tuple[int, ...] = (M_CHUNK,)
        chunk_kinds += (M_CHUNK_BAD,) if "corrupt" in c.fault_kinds else ()
        chunk_kinds += (M_CHUNK_UNSTAGED,) if c.identity else ()
        out |= {msg(k, e, i) for k in chunk_kinds for i in range(c.src_tp * c.blocks)}
        out |= {msg(M_DONE, e, rank) for rank in range(c.src_tp)}
    # restarts: each code of every incarnation (a control message its sender's, a write
    # the decode incarnation it targets: spec/behaviours/restarts.py)
    out = {code | inc << 24 for code in out for inc in range(c.restarts + 1)}
    return tuple(sorted(out))


def auto_bits(c: Config) -> int:
    """Width of the bit-vectors that hold the scalars of ``c`` (signed, with a margin)."""
    bound = max(
        c.max_attempts + 1,
        c.src_tp * (c.blocks + 1) + 1,
        c.cap_p + c.blocks,
        c.cap_d + c.blocks,
        c.cap_h + c.blocks,
        (c.n_reqs + 1) * c.blocks + c.prefix,
        c.faults + 2,
        c.max_moves + 1,
        c.n_reqs + 1,
        c.n_reqs * (c.max_moves + 1) + 1,  # hc_pin, hc_late (the shared host cache)
        c.max_turns + 1,
        7,  # the largest status / replica code
    )
    return bound.bit_length() + 2


def conj(terms: list[Z]) -> Z:
    """``z3.And`` of many Boolean terms, without z3py's per-argument coercion."""
    if not terms:
        return z3.BoolVal(True)
    ctx = terms[0].ctx
    arr = (z3.Ast * len(terms))(*(t.as_ast() for t in terms))
    return z3.BoolRef(z3.Z3_mk_and(ctx.ref(), len(terms), arr), ctx)


class FState:
    """The variables of one symbolic state, by key."""

    def __init__(self, enc: Encoding, tag: str) -> None:
        self.tag = tag
        self.v: dict[Key, Z] = {}
        for i in range(enc.c.n_reqs):
            for f in enc.fields:
                self.v[("r", i, f)] = enc.field_var(f"{f}{i}@{tag}", f)
            for code in enc.codes:
                self.v[("n", i, code)] = enc.scalar(f"net{i}_{code:x}@{tag}")
        for g in enc.globs:
            boolean = g in ("p_up", "d_up", "pfx", "pfx_ok", "hc_bad")
            self.v[("g", g)] = z3.Bool(f"{g}@{tag}") if boolean else enc.scalar(f"{g}@{tag}")

    def __getitem__(self, key: Key) -> Z:
        return self.v[key]


class FNet(NetView):
    def __init__(self, enc: Encoding, s: FState, i: int) -> None:
        self.enc, self.s, self.i = enc, s, i

    def count(self, kind: int, e: Z, i: Z) -> Z:
        out: Z = 0
        for code in self.enc.codes:
            if msg_kind(code) == kind:
                hit = A(EQ(e, msg_epoch(code)), EQ(i, msg_idx(code)))
                out = out + ITE(hit, self.s[("n", self.i, code)], 0) if hit is not False else out
        return out

    def empty(self) -> Z:
        return A(*(self.s[("n", self.i, code)] == 0 for code in self.enc.codes))

    def same(self, other: NetView) -> Z:
        if not isinstance(other, FNet) or other.enc is not self.enc:
            raise TypeError("messages of two encodings compared")
        n, m = ("n", self.i), ("n", other.i)
        return A(*(self.s[(*n, k)] == other.s[(*m, k)] for k in self.enc.codes))

    def no_chunks(self, e: Z) -> Z:
        return A(
            *(
                O(N(EQ(e, msg_epoch(code))), self.s[("n", self.i, code)] == 0)
                for code in self.enc.codes
                if msg_kind(code) in CHUNKS
            )
        )


class FCtx(Ctx):
    def __init__(self, enc: Encoding, s: FState) -> None:
        self.enc, self.s = enc, s
        self.c, self.m = enc.params, enc.m
        self.faults, self.pfx_ref = s[("g", "faults")], s[("g", "pfx_ref")]
        self.p_up, self.d_up, self.pfx = s[("g", "p_up")], s[("g", "d_up")], s[("g", "pfx")]
        self.pfx_ok = s[("g", "pfx_ok")]
        for g in enc.globs:
            if g not in GLOBALS:
                setattr(self, g, s[("g", g)])

    def views(self) -> list[Any]:
        return [self.enc.view(self.s, i) for i in self._reqs()]

    def num(self, v: Z) -> Z:
        return self.enc.num(v)

    def _reqs(self) -> range:
        return range(self.enc.c.n_reqs)

    def used_p(self) -> Z:
        """``spec.common.used_p``: a streamed offer that gave its source back (``fs``,
        where the encoding holds it) holds no prefill block; a copy that pruned its window
        (``pw``, where the encoding holds it) holds ``pw`` fewer blocks."""
        b, z, s = self.num(self.c.blocks), self.num(0), self.s
        fs, pw = "fs" in self.enc.fields, "pw" in self.enc.fields
        out = []
        for i in self._reqs():
            h = (
                A(s[("r", i, "p")] != NONE, N(s[("r", i, "fs")] != 0))
                if fs
                else s[("r", i, "p")] != NONE
            )
            out.append(ITE(h, b - s[("r", i, "pw")] if pw else b, z))
        return z3.Sum(*out)

    def used_h(self) -> Z:
        """``spec.common.used_h``: the requests' swap copies, and the shared host cache's
        copy and the orphans of its late completions (where the encoding holds it)."""
        b, z = self.num(self.c.blocks), self.num(0)
        own = z3.Sum(*(ITE(self.s[("r", i, "h")] != NONE, b, z) for i in self._reqs()))
        if "hc" not in self.enc.globs:
            return own
        shared = ITE(self.s[("g", "hc")] != NONE, self.num(1), z) + self.s[("g", "hc_late")]
        return own + b * shared

    def used_d(self) -> Z:
        own = [
            ITE(self.s[("r", i, "d")] != NONE, self.c.blocks - self.s[("r", i, "hit")], self.num(0))
            for i in self._reqs()
        ]
        return z3.Sum(*own) + ITE(self.pfx, self.num(self.c.prefix), self.num(0))

    def refs(self) -> Z:
        s = self.s
        held = (A(s[("r", i, "d")] != NONE, s[("r", i, "hit")] > 0) for i in self._reqs())
        return z3.Sum(*(ITE(h, self.num(1), self.num(0)) for h in held))

    def host_pins(self) -> Z:
        if "hk" not in self.enc.fields:
            return 0
        s, one, z = self.s, self.num(1), self.num(0)
        pinned = (IN(s[("r", i, "hk")], HK_PINNED) for i in self._reqs())
        return z3.Sum(*(ITE(p, one, z) for p in pinned))

    def admit_possible(self) -> Z:
        s = self.s
        waiting = (
            A(
                IN(s[("r", i, "st")], (QUEUED, PREEMPTED)),
                s[("r", i, "p")] == NONE,
                s[("r", i, "h")] == NONE,
            )
            for i in self._reqs()
        )
        return A(self.p_up, self.used_p() + self.c.blocks <= self.c.cap_p, O(*waiting))

    def slot_free(self) -> Z:
        return A(*(self.s[("r", i, "sl")] == 0 for i in self._reqs()))

    def lempty(self) -> Z:
        return z3.BitVecVal(0, self.enc.width)

    def ladd(self, s: Z, idx: Z) -> Z:
        w = self.enc.width
        if isinstance(idx, int):
            return s | z3.BitVecVal((1 << idx) & ((1 << w) - 1), w)
        k = z3.Int2BV(idx, w) if z3.is_int(idx) else z3.ZeroExt(w, idx)
        return s | z3.Extract(w - 1, 0, z3.BitVecVal(1, 2 * w + idx.size()) << k)

    def lfull(self, s: Z, hit: Z) -> Z:
        c, w = self.enc.c, self.enc.width
        full: Z = z3.BitVecVal(0, w)  # hit > blocks: never reached
        for h in reversed(range(c.blocks + 1)):
            full = ITE(EQ(hit, h), z3.BitVecVal((1 << (c.src_tp * (c.blocks - h))) - 1, w), full)
        return s == full
