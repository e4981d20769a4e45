"""The spec's transition system in z3, for one finite config: <init, trans, bad>.

System.  A ``Config`` (and mutants) fixes the requests and the possible message codes.

Model.  A symbolic state (``FState``) holds, per request, the scalar ``Req`` fields of
the config's behaviours, one count per possible message code (the multiset ``Req.net``),
and the globals: bit-vectors (signed, ``auto_bits`` wide; ``bits=0``: ints) and Booleans.
The actions are the traced ones (``actions``: same names as the spec), instantiated per
(action, request slot, argument): the argument is the message code for actions that
consume one, the worker for ``EnvCrash``, ``EnvRestart``; these ``Inst`` labels are
exactly the explorer's edge labels.

- ``action(inst, s, t)``: that instance's transition with an explicit frame (every
  variable of ``t`` is defined: changed, or equal to ``s``);
- ``trans(s, t)``: the disjunction of all instances;
- ``step(s, t, sel)``: the same relation, compact: ``sel`` is the index of the instance
  taken, and each variable of ``t`` is one if-then-else over the instances that change
  it. BMC and the agreement test use it; the model's ``sel`` names the action. Some
  instances are split into parts (``Sub``) on the fields that decide which message
  code they send, so that every code is concrete; ``step_fast`` renames one template.
- ``init(s)``, ``holds(prop, s)`` / ``bad(prop, s)``, and ``world(model, s)`` /
  ``is_world(s, w)`` to go from and to the explicit ``World``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import z3

from model_checks.symbolic.actions import GLOBAL, GLOBAL_FNS, PER_REQ, WORKER
from model_checks.symbolic.core import (
    BV_FIELDS,
    EQ,
    FIELDS,
    GLOBALS,
    HOST_FIELDS,
    HOST_GLOBALS,
    ITE,
    RESTART_FIELDS,
    RESTART_GLOBALS,
    RV,
    STREAM_FIELDS,
    TURN_FIELDS,
    WINDOW_FIELDS,
    A,
    Go,
    Msg,
    N,
    NetOp,
    O,
    Params,
    Z,
    same,
)
from model_checks.symbolic.finite import (
    PIN_GLOBALS,
    FCtx,
    FNet,
    FState,
    Inst,
    Key,
    Pins,
    Sub,
    auto_bits,
    conj,
    pin_fields,
    possible_codes,
)
from model_checks.symbolic.props import ZPROPS, finite_holds
from model_checks.symbolic.tracer.worker import trace_worker
from spec.actions import ACTIONS
from spec.config import Config
from spec.state import (
    CHUNKS,
    TO_DECODE,
    Req,
    World,
    msg,
    msg_epoch,
    msg_idx,
    msg_inc,
    msg_kind,
)

Case = tuple[Z, dict[Key, Z], str]  # guard, changed variables, branch label


class Encoding:
    """<init, trans, bad> of one config under a set of mutants."""

    def __init__(
        self,
        c: Config,
        mutants: frozenset[str] = frozenset(),
        bits: int | None = None,
        split: bool = True,
        instances: bool = True,
    ) -> None:
        self.c, self.m = c, frozenset(mutants)
        self.params = Params.of(c)
        self.codes = possible_codes(c)
        self.width = max(1, c.src_tp * c.blocks)
        self.bits = auto_bits(c) if bits is None else bits
        ext = (HOST_FIELDS if c.host_cache else ()) + (TURN_FIELDS if c.turns else ())
        ext += (STREAM_FIELDS if c.layers else ()) + (RESTART_FIELDS if c.restarts else ())
        ext += WINDOW_FIELDS if c.window else ()
        self.fields = FIELDS + ext  # the request fields held as variables
        self.globs = GLOBALS + (HOST_GLOBALS if c.host_cache else ())
        self.globs += RESTART_GLOBALS if c.restarts else ()
        self.split = split
        self._eq_cache: dict[tuple[str, Key, Any], Z] = {}
        self._tmpl_step: tuple[FState, FState, Z, Z] | None = None
        self._holds: dict[str, Z] = {}
        self._n = 0
        tmpl = self.tmpl = self.state("tmpl")
        # instances=False: only the variables and the Ctx (a tracer's caller; no relation)
        self.insts = [k for k in self._all_instances() if instances and self.effects(k, tmpl)]
        self.subs = [u for k in self.insts for u in self._split(k) if self.effects(u, tmpl)]

    # -- variables --------------------------------------------------------------------
    def field_var(self, name: str, f: str) -> Z:
        if f in BV_FIELDS:
            return z3.BitVec(name, BV_FIELDS[f])
        if f == "landed":
            return z3.BitVec(name, self.width)
        if f == "rmask":
            return z3.BitVec(name, self.c.src_tp)
        return self.scalar(name)

    def num(self, v: Z) -> Z:
        if isinstance(v, int) and self.bits:
            return z3.BitVecVal(v, self.bits)
        return v

    def scalar(self, name: str) -> Z:
        return z3.BitVec(name, self.bits) if self.bits else z3.Int(name)

    def state(self, tag: str | None = None) -> FState:
        if tag is None:
            self._n += 1
            tag = f"s{self._n}"
        return FState(self, tag)

    def view(self, s: FState, i: int) -> RV:
        return RV(**{f: s[("r", i, f)] for f in self.fields}, net=FNet(self, s, i))

    # -- actions ----------------------------------------------------------------------
    def _all_instances(self) -> Iterator[Inst]:
        by_kind = {
            k: [a.name for a in ACTIONS.values() if a.arg == "msg" and k in a.msgs]
            for k in range(16)
        }
        for i in range(self.c.n_reqs):
            for a in ACTIONS.values():
                if a.arg == "req":
                    yield Inst(a.name, i, 0)
            for code in self.codes:
                for name in by_kind[msg_kind(code)]:
                    yield Inst(name, i, code)
        for name in GLOBAL:
            yield Inst(name, 0, 0)
        if "crash" in self.c.fault_kinds:
            yield Inst("EnvCrash", 0, 0)
            yield Inst("EnvCrash", 0, 1)
        if self.c.restarts:
            yield Inst("EnvRestart", 0, 0)
            yield Inst("EnvRestart", 0, 1)

    def _pin_values(self, f: str) -> list[Any]:
        c = self.c
        if f in ("ep", "dep"):
            return list(range(c.max_attempts + 1))
        if f == "sent":
            return list(range(c.src_tp * (c.blocks + 1)))
        if f == "phit":
            return sorted({0, c.prefix})
        if f == "pfx":
            return [False, True]
        if f in ("p_inc", "d_inc", "rinc"):
            return list(range(c.restarts + 1))
        raise ValueError(f"{f}: no pin values (a message code that depends on it)")

    def _split(self, k: Inst) -> list[Sub]:
        fields = pin_fields(self, self.tmpl, k) if self.split else ()
        if not fields:
            return [Sub(k)]
        combos: list[Pins] = [()]
        for f in fields:
            combos = [(*pc, (f, v)) for pc in combos for v in self._pin_values(f)]
        return [*(Sub(k, pc) for pc in combos), Sub(k, (), tuple(combos))]

    def _pin_guard(self, s: FState, i: int, pins: Pins) -> Z:
        return A(*(s[("g", f) if f in PIN_GLOBALS else ("r", i, f)] == v for f, v in pins))

    def effects(self, u: Inst | Sub, s: FState) -> list[Case]:
        """The mutually exclusive cases of an instance (or a pinned part of one) from
        ``s``: guard and the variables it changes."""
        if isinstance(u, Inst):
            return [c for part in self._split(u) for c in self.effects(part, s)]
        k, x = u.inst, FCtx(self, s)
        view = self.view(s, k.i)
        pin = self._pin_guard(s, k.i, u.pins)
        for f, v in u.pins:
            setattr(x if f in PIN_GLOBALS else view, f, v)
        if u.rest:
            pin = N(O(*(self._pin_guard(s, k.i, pc) for pc in u.rest)))
        return [
            (A(pin, g), ch, lb)
            for g, ch, lb in self._effects(k, x, view, s)
            if A(pin, g) is not False
        ]

    def _effects(self, k: Inst, x: FCtx, view: RV, s: FState) -> list[Case]:
        if k.name in WORKER:
            return self._worker(k.name, x, s, k.arg)
        if k.name in GLOBAL:
            fn = GLOBAL_FNS[k.name]
            return [(g, self._changes(x, s, 0, go), lb) for g, go, lb in fn(x).cases()]
        a = ACTIONS[k.name]
        m = None
        if a.arg == "msg":
            m = Msg(msg_kind(k.arg), msg_epoch(k.arg), msg_idx(k.arg), msg_inc(k.arg))
        rules = PER_REQ[k.name](x, view, m)
        present = s[("n", k.i, k.arg)] >= 1 if m is not None else True
        out = []
        for g, go, lb in rules.cases():
            guard = A(present, g, self._representable(x, go))
            if guard is not False:
                out.append((guard, self._changes(x, s, k.i, go), lb))
        return out

    def _representable(self, x: FCtx, go: Go) -> Z:
        """When ``go`` would put a code outside ``codes`` in flight (a message of epoch 0,
        say, from a pinned state that is never reached), that state is left out."""
        out = []
        for op in (op for g in (go, *go.others.values()) for op in g.net):
            if op.op in ("send", "add") and isinstance(op.e, int) and isinstance(op.i, int):
                inc = op.inc if isinstance(op.inc, int) else 0
                if msg(op.kind, op.e, op.i, inc) not in self.codes:
                    up = (x.d_up if op.kind in TO_DECODE else x.p_up) if op.op == "send" else True
                    out.append(N(A(op.when, up)))
        return A(*out)

    def _changes(self, x: FCtx, s: FState, i: int, go: Go) -> dict[Key, Z]:
        ch: dict[Key, Z] = {}
        for f, v in go.req.items():
            if not same(v, s[("r", i, f)]):
                ch[("r", i, f)] = v
        for gname, v in go.glob.items():
            if not same(v, s[("g", gname)]):
                ch[("g", gname)] = v
        ch.update(self._net(x, s, i, go.net))
        for j, o in go.others.items():  # another request the step changes (by its slot)
            ch.update(self._changes(x, s, j, o))
        return ch

    def _net(self, x: FCtx, s: FState, i: int, ops: tuple[NetOp, ...]) -> dict[Key, Z]:
        ch: dict[Key, Z] = {}
        for code in self.codes:
            kind, e, idx, inc = msg_kind(code), msg_epoch(code), msg_idx(code), msg_inc(code)
            v0 = v = s[("n", i, code)]
            for op in ops:
                if op.op == "drop":
                    if kind in CHUNKS:
                        v = ITE(A(op.when, EQ(op.e, e)), 0, v)
                    continue
                if op.kind != kind:
                    continue
                hit = A(op.when, EQ(op.e, e), EQ(op.i, idx), EQ(op.inc, inc))
                if op.op == "send":
                    hit = A(hit, x.d_up if kind in TO_DECODE else x.p_up)
                if hit is False:
                    continue
                v = ITE(hit, v - 1 if op.op == "take" else v + 1, v)
            if not same(v, v0):
                ch[("n", i, code)] = v
        return ch

    def _worker(self, name: str, x: FCtx, s: FState, worker: int) -> list[Case]:
        cr = trace_worker(name, x, worker)
        if cr.cond is False:
            return []
        ch: dict[Key, Z] = {("g", k): v for k, v in cr.glob.items()}
        for i in range(self.c.n_reqs):
            for f, v in cr.per_req(self.view(s, i)).items():
                if not same(v, s[("r", i, f)]):
                    ch[("r", i, f)] = v
            for code in self.codes:
                if msg_kind(code) not in cr.keep:
                    ch[("n", i, code)] = 0
        return [(cr.cond, ch, f"{name}#0")]

    # -- the transition system ----------------------------------------------------------
    def action(self, k: Inst, s: FState, t: FState) -> Z:
        """Instance ``k``'s transition, with an explicit frame."""
        cases = self.effects(k, s)
        eqs = []
        for key, pre in s.v.items():
            val = pre
            for g, ch, _ in cases:
                if key in ch:
                    val = ITE(g, ch[key], val)
            eqs.append(t[key] == val)
        return A(O(*(g for g, _, _ in cases)), *eqs)

    def trans(self, s: FState, t: FState) -> Z:
        return O(*(self.action(k, s, t) for k in self.insts))

    def step(self, s: FState, t: FState, sel: Z) -> Z:
        """``trans`` with a selector: ``sel`` is the index (in ``subs``) of the instance
        (part) taken."""
        chains: dict[Key, Z] = dict(s.v)
        enabled = []
        for j, k in enumerate(self.subs):
            cases = self.effects(k, s)
            enabled.append(A(sel == j, O(*(g for g, _, _ in cases))))
            for g, ch, _ in cases:
                gj = A(sel == j, g)
                for key, val in ch.items():
                    chains[key] = ITE(gj, val, chains[key])
        return A(O(*enabled), *(t[key] == val for key, val in chains.items()))

    def step_fast(self, s: FState, t: FState, sel: Z) -> Z:
        """``step`` built once on template states, renamed onto ``s``, ``t``, ``sel``."""
        if self._tmpl_step is None:
            a, b = self.state("tmpl_a"), self.state("tmpl_b")
            tsel = z3.BitVec("tmpl_sel", sel.size()) if z3.is_bv(sel) else z3.Int("tmpl_sel")
            self._tmpl_step = (a, b, tsel, self.step(a, b, tsel))
        a, b, tsel, f = self._tmpl_step
        pairs = [(a.v[k], s.v[k]) for k in a.v] + [(b.v[k], t.v[k]) for k in b.v]
        return z3.substitute(f, *pairs, (tsel, sel))

    def init(self, s: FState) -> Z:
        return self.is_world(s, self.c.initial())

    def holds(self, prop: str, s: FState) -> Z:
        """``prop`` at ``s``: traced once on the template state, renamed onto ``s``."""
        t = self._holds.get(prop)
        if t is None:
            t = self._holds[prop] = finite_holds(self, ZPROPS[prop], self.tmpl)
        if s is self.tmpl or isinstance(t, bool):
            return t
        return z3.substitute(t, *((self.tmpl.v[k], s.v[k]) for k in self.tmpl.v))

    def bad(self, prop: str, s: FState) -> Z:
        return N(self.holds(prop, s))

    # -- to and from the explicit spec --------------------------------------------------
    def values(self, w: World) -> dict[Key, Any]:
        """The value of every state variable in the concrete state ``w``."""
        if len(w.reqs) != self.c.n_reqs:
            raise ValueError(f"{len(w.reqs)} requests, config {self.c.name} has {self.c.n_reqs}")
        out: dict[Key, Any] = {}
        for i, r in enumerate(w.reqs):
            for f in self.fields:
                out[("r", i, f)] = getattr(r, f)
            extra = set(r.net) - set(self.codes)
            if extra:
                raise ValueError(f"message codes {sorted(extra)} outside the encoding")
            for code in self.codes:
                out[("n", i, code)] = r.net.count(code)
        for gname in self.globs:
            out[("g", gname)] = getattr(w, gname)
        return out

    def eqs(self, s: FState, w: World) -> list[Z]:
        """``s == w``, one equality per variable (cached: states share most of them)."""
        out = []
        cache = self._eq_cache
        for key, v in self.values(w).items():
            ck = (s.tag, key, v)
            term = cache.get(ck)
            if term is None:
                term = cache[ck] = s.v[key] == v
            out.append(term)
        return out

    def is_world(self, s: FState, w: World) -> Z:
        return conj(self.eqs(s, w))

    def world(self, model: Any, s: FState) -> World:
        def val(key: Key) -> int:
            v = model[s[key]]
            if v is None:
                v = model.eval(s[key], model_completion=True)
            return int(z3.is_true(v)) if z3.is_bool(v) else int(v.as_long())

        reqs = []
        for i in range(self.c.n_reqs):
            net: list[int] = []
            for code in self.codes:
                net += [code] * val(("n", i, code))
            reqs.append(Req(**{f: val(("r", i, f)) for f in self.fields}, net=tuple(sorted(net))))
        bools = ("p_up", "d_up", "pfx", "pfx_ok", "hc_bad")
        glob: dict[str, Any] = {
            g: bool(val(("g", g))) if g in bools else val(("g", g)) for g in self.globs
        }
        return World(reqs=tuple(reqs), **glob)
