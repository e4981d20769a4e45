"""Inductive invariants for any number of requests, blocks and capacity (z3).

System.  ``z3_unbounded.UModel``: requests of an uninterpreted sort, symbolic config.

Properties.  Each safety property P of spec/properties.py is proven with an invariant
``Inv_P`` = P and its support (``z3_invariants.SUPPORT[P]``; written out, with what each
conjunct means, in spec/INVARIANTS.md):

- Init => Inv_P;
- Inv_P /\\ Trans => Inv_P', one query per transition (per spec action, per message
  kind it consumes, per crashed worker).

Every query goes through ``prove``: the negation of the goal is asserted, and unsat is
the proof; on sat the model is a counterexample to induction (``CTI``: two readable
states and the action between them). Hypotheses are asserted with
``assert_and_track`` under the names of the spec clauses they are (invariant conjunct
at a request, the action's transition, a config fact), so an unsat core says which
ones the proof needed.

Quantifiers.  ``Inv_P`` is universal: for every request (and every message slot). The
goal is its negation at fresh constants (a request ``x``, a slot of ``x``); the
hypothesis is Inv_P instantiated where the step looks: at ``x``, at the acting request
``r0``, at the slot of the message it consumes and at the slot of its last chunk.
Using fewer instances than the universal hypothesis is sound (a weaker hypothesis), so
unsat is a proof; a CTI may, in turn, be a state the full invariant excludes, so it is
reported as "unknown", never "violated". Ghost counters equal the sums they count; the
pre-state facts used about them are consequences (a sum of non-negative terms is at
least any two of them).

Every Inv_P is 1-inductive (plain induction): no k-induction was needed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from model_checks.symbolic.actions import GLOBAL
from model_checks.symbolic.core import RV, A, Msg, Z
from model_checks.symbolic.invariants import KINDS, PROPERTY_CONJUNCTS, STRENGTHENING, SUPPORT, Conj
from model_checks.symbolic.unbounded import REQ, Probe, UAction, UModel, UState, contributions
from spec.state import MSG_NAMES, REPLICA_NAMES, SENDER_NAMES, STATUS_NAMES

Slot = tuple[Z, Z]  # (epoch, idx): a message slot of a request


def conjuncts(names: Iterable[str]) -> list[Conj]:
    out: list[Conj] = []
    for n in names:
        if n in PROPERTY_CONJUNCTS:
            out += PROPERTY_CONJUNCTS[n]
        else:
            out.append(STRENGTHENING[n])
    return out


def instance(m: UModel, s: UState, c: Conj, r: Z, slot: Slot | None = None) -> Z:
    """Conjunct ``c`` in state ``s`` at request ``r`` (and message slot)."""
    x = m.ctx(s)
    if c.scope == "glob":
        assert c.glob is not None
        return c.glob(x)
    v = m.view(s, r)
    if c.scope == "req":
        assert c.req is not None
        return c.req(x, v)
    assert c.slot is not None and slot is not None
    return c.slot(x, v, *slot)


def holds(m: UModel, s: UState, cs: Sequence[Conj], r: Z, slot: Slot) -> Z:
    return A(*(instance(m, s, c, r, slot if c.scope == "slot" else None) for c in cs))


def probes(x: Z, slot: Slot) -> list[Probe]:
    """Every message kind at ``x``'s slot: where the goal reads the post-state."""
    return [(x, k, *slot) for k in KINDS]


@dataclass
class CTI:
    """A counterexample to induction: a state satisfying the hypothesis, the action,
    and the successor that breaks ``failed``."""

    action: str
    failed: list[str]
    pre: list[str]
    post: list[str]

    def render(self) -> str:
        lines = [f"  before:  {self.pre[0]}", *(f"           {x}" for x in self.pre[1:])]
        lines.append(f"  action:  {self.action}")
        lines += [f"  after:   {self.post[0]}", *(f"           {x}" for x in self.post[1:])]
        lines.append(f"  breaks:  {', '.join(self.failed)}")
        return "\n".join(lines)


@dataclass
class StepResult:
    action: str
    result: str  # "proved", "cti" or "unknown" (solver gave up)
    core: list[str] = field(default_factory=list)
    cti: CTI | None = None
    seconds: float = 0.0


@dataclass
class Proof:
    prop: str
    conjuncts: tuple[str, ...]
    method: str  # "induction" or "k-induction"
    result: str  # "proved" or "unknown"
    steps: list[StepResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def cti(self) -> CTI | None:
        return next((s.cti for s in self.steps if s.cti is not None), None)


def prove(
    solver: Any,
    hyps: Sequence[tuple[str, Z]],
    goal: Z,
    timeout_ms: int = 60_000,
    minimize_core: bool = False,
    small: Callable[[], Sequence[Z]] | None = None,
) -> tuple[str, list[str], Any]:
    """The one proof helper: assert the named hypotheses (tracked) and the negated
    goal; "proved" on unsat (with the unsat core's names), else "cti"/"unknown".
    On sat, ``small`` (bounds on the numbers) is tried first, for a readable CTI."""
    solver.set("timeout", timeout_ms)
    if minimize_core:
        solver.set("core.minimize", True)
    for name, h in hyps:
        solver.assert_and_track(h, name)
    solver.add(z3.Not(goal) if not isinstance(goal, bool) else z3.BoolVal(not goal))
    r = solver.check()
    if r == z3.unsat:
        return "proved", sorted(str(c) for c in solver.unsat_core()), None
    if r == z3.sat:
        model = solver.model()
        if small is not None:
            solver.push()
            solver.add(*small())
            if solver.check() == z3.sat:
                model = solver.model()
            solver.pop()
        return "cti", [], model
    return "unknown", [], None


def _tagged(hyps: list[tuple[str, Z]]) -> list[tuple[str, Z]]:
    seen: dict[str, int] = {}
    out = []
    for name, h in hyps:
        if h is True:
            continue
        if isinstance(h, bool):
            h = z3.BoolVal(h)
        seen[name] = seen.get(name, 0) + 1
        out.append((name if seen[name] == 1 else f"{name}#{seen[name]}", h))
    return out


class Prover:
    """Induction queries for one TP degree (src_tp). The states, the fresh constants,
    each conjunct's instances and each transition are built once and shared by every
    query of this prover."""

    def __init__(
        self, src_tp: int = 2, minimize_core: bool = False, mutants: frozenset[str] = frozenset()
    ) -> None:
        m = self.m = UModel(src_tp, mutants)
        self.minimize_core = minimize_core
        self.s, self.t, self.s0 = m.state("pre"), m.state("post"), m.state("init")
        self.r0, self.x = z3.Const("r0", REQ), z3.Const("x", REQ)
        self.pt: Slot = (z3.Int("e_x"), z3.Int("i_x"))
        self.em, self.im = z3.Int("e_m"), z3.Int("i_m")
        self.probes = probes(self.x, self.pt)
        v0 = m.view(self.s, self.r0)
        last = m.params.src_tp * (m.params.blocks - v0.hit) - 1
        # where the hypothesis is instantiated: x's slot, the consumed message's slot,
        # and the last chunk of r0's attempt
        self.slots = [
            ("x", self.x, self.pt),
            ("msg", self.r0, (self.em, self.im)),
            ("last", self.r0, (v0.dep, last)),
        ]
        self.base = [*m.param_facts, *self._counting(self.s, self.r0, self.x)]
        self._hyps: dict[str, list[tuple[str, Z]]] = {}
        self._goals: dict[tuple[str, str], Z] = {}
        self._trans: dict[UAction, Z] = {}
        self._small_terms: list[Z] | None = None

    def _hyp(self, c: Conj) -> list[tuple[str, Z]]:
        got = self._hyps.get(c.name)
        if got is None:
            m, s = self.m, self.s
            if c.scope == "glob":
                got = [(c.name, instance(m, s, c, self.x))]
            elif c.scope == "req":
                got = [
                    (f"{c.name}@{n}", instance(m, s, c, r))
                    for n, r in (("r0", self.r0), ("x", self.x))
                ]
            else:
                got = [(f"{c.name}@{n}", instance(m, s, c, r, sl)) for n, r, sl in self.slots]
            self._hyps[c.name] = got
        return got

    def _goal(self, cs: Sequence[Conj], s: UState) -> Z:
        out = []
        for c in cs:
            g = self._goals.get((c.name, s.tag))
            if g is None:
                g = self._goals[(c.name, s.tag)] = holds(self.m, s, [c], self.x, self.pt)
            out.append(g)
        return A(*out)

    def _step_trans(self, act: UAction) -> Z:
        tr = self._trans.get(act)
        if tr is None:
            msg = Msg(act.kind, self.em, self.im) if act.kind is not None else None
            tr = self._trans[act] = self.m.trans(act, self.s, self.t, self.r0, msg, self.probes)
        return tr

    def init_step(self, cs: Sequence[Conj], goal: Sequence[Conj] | None = None) -> StepResult:
        t0 = time.perf_counter()
        s, x, pt = self.s0, self.x, self.pt
        hyps = [*self.m.param_facts, ("Init", self.m.init(s, self.probes))]
        gs = cs if goal is None else goal
        verdict, core, model = prove(
            z3.Solver(), _tagged(hyps), self._goal(gs, s), minimize_core=self.minimize_core
        )
        cti = None
        if model is not None:
            failed = self._failed(model, s, gs, x, pt)
            cti = CTI("Init", failed, ["(none)"], self._describe(model, s, [x], pt))
        return StepResult("Init", verdict, core, cti, time.perf_counter() - t0)

    def step(
        self, cs: Sequence[Conj], act: UAction, goal: Sequence[Conj] | None = None
    ) -> StepResult:
        """Inv(cs) /\\ act => Inv(goal)' (goal: cs when not given)."""
        t0 = time.perf_counter()
        s, t, r0, x, pt = self.s, self.t, self.r0, self.x, self.pt
        hyps = list(self.base)
        for c in cs:
            hyps += self._hyp(c)
        hyps.append((act.label, self._step_trans(act)))
        gs = cs if goal is None else goal
        verdict, core, model = prove(
            z3.Solver(),
            _tagged(hyps),
            self._goal(gs, t),
            minimize_core=self.minimize_core,
            small=self._small,
        )
        cti = None
        if model is not None:
            failed = self._failed(model, t, gs, x, pt)
            who = [r0, x]
            label = act.label
            if act.kind is not None:
                e, i = (model.eval(v, model_completion=True) for v in (self.em, self.im))
                label = f"{act.name}({MSG_NAMES[act.kind]}(e={e},i={i})) by r0"
            elif act.worker is None and act.name not in GLOBAL:
                label = f"{act.name} by r0"
            cti = CTI(
                label, failed, self._describe(model, s, who, pt), self._describe(model, t, who, pt)
            )
        return StepResult(act.label, verdict, core, cti, time.perf_counter() - t0)

    def _small(self) -> list[Z]:
        """Small numbers everywhere the CTI shows (tried only after a sat answer)."""
        if self._small_terms is not None:
            return self._small_terms
        m, out = self.m, []
        p = m.params
        for v in (p.blocks, p.cap_p, p.cap_d, p.cap_h, p.prefix, p.faults, p.max_attempts):
            out += [v >= 0, v <= 4]
        out += [p.max_moves >= 0, p.max_moves <= 4]
        for s in (self.s, self.t):
            for r in (self.r0, self.x):
                v = m.view(s, r)
                for f in ("ep", "dep", "sent", "phit", "hit", "hl", "gl", "mv", "rcnt"):
                    out += [v.get(f) >= -1, v.get(f) <= 8]
                out += [s.net[pr] >= -1 for pr in self.probes if pr[0] is r]
                out += [s.net[pr] <= 3 for pr in self.probes if pr[0] is r]
            out += [s.g["faults"] <= 4, s.g["pfx_ref"] >= -1, s.g["pfx_ref"] <= 4]
            out += [z3.And(k >= -1, k <= 16) for k in s.k.values()]
        out += [z3.And(t >= -1, t <= 8) for t in (*self.pt, self.em, self.im)]
        self._small_terms = out
        return out

    def _counting(self, s: UState, r0: Z, x: Z) -> list[tuple[str, Z]]:
        """A ghost counter is the sum of non-negative contributions, so it is at least
        the contribution of r0, of x, and of both when they differ."""
        m = self.m
        a, b = contributions(m.params, m.view(s, r0)), contributions(m.params, m.view(s, x))
        out = []
        for name, total in s.k.items():
            fact = z3.And(total >= a[name], total >= b[name])
            out.append((f"count:{name}", z3.And(fact, z3.Or(r0 == x, total >= a[name] + b[name]))))
        return out

    def _failed(self, model: Any, s: UState, cs: Sequence[Conj], x: Z, pt: Slot) -> list[str]:
        out = []
        for c in cs:
            term = instance(self.m, s, c, x, pt if c.scope == "slot" else None)
            if not z3.is_true(model.eval(term, model_completion=True)):
                out.append(f"{c.name}@x" if c.scope != "glob" else c.name)
        return out

    def _describe(self, model: Any, s: UState, who: Sequence[Z], pt: Slot) -> list[str]:
        """Readable request records (r0 and x; one line when they are the same request)."""

        def ev(t: Z) -> Any:
            return model.eval(t, model_completion=True)

        lines: list[str] = []
        names = ["r0", "x"][-len(who) :] if len(who) == 2 else ["x"]
        done: list[Z] = []
        for name, r in zip(names, who, strict=True):
            if any(z3.is_true(ev(r == d)) for d in done):
                lines[-1] = lines[-1].replace("r0:", "r0 = x:", 1)
                continue
            done.append(r)
            lines.append(f"{name}: " + self._req_line(ev, self.m.view(s, r), s, r, pt))
        g = {k: ev(v) for k, v in s.g.items()}
        k = {n: ev(v) for n, v in s.k.items()}
        lines.append("globals: " + " ".join(f"{n}={v}" for n, v in {**g, **k}.items()))
        return lines

    def _req_line(self, ev: Any, v: RV, s: UState, r: Z, pt: Slot) -> str:
        names = {"st": STATUS_NAMES, "p": REPLICA_NAMES, "d": REPLICA_NAMES, "h": REPLICA_NAMES}
        names["ps"] = SENDER_NAMES
        parts = []
        for f in (
            "st",
            "p",
            "d",
            "h",
            "ps",
            "ep",
            "dep",
            "sent",
            "phit",
            "hit",
            "rmask",
            "dfl",
            "g",
        ):
            val = ev(v.get(f))
            txt = str(val)
            if f in names and z3.is_int_value(val) and 0 <= val.as_long() < len(names[f]):
                txt = names[f][val.as_long()]
            parts.append(f"{f}={txt}")
        for f in ("pstep", "dstep", "tn", "ti", "tdv", "tc"):  # shown where not 0
            val = ev(v.get(f))
            if not (z3.is_int_value(val) and val.as_long() == 0):
                parts.append(f"{f}={val}")
        e, i = (ev(t) for t in pt)
        for k in KINDS:
            n = ev(s.net[r, k, pt[0], pt[1]])
            if z3.is_int_value(n) and n.as_long() != 0:
                parts.append(f"{MSG_NAMES[k]}(e={e},i={i})x{n}")
        if z3.is_true(ev(v.landed[pt[1]])):
            parts.append(f"landed[{i}]")
        return " ".join(parts)

    def proof(self, prop: str, names: Sequence[str] | None = None) -> Proof:
        """Init and every transition, for ``prop`` with its support (or ``names``)."""
        t0 = time.perf_counter()
        names = tuple(names) if names is not None else (prop, *SUPPORT[prop])
        cs = conjuncts(names)
        steps = [self.init_step(cs), *(self.step(cs, a) for a in self.m.actions())]
        ok = all(s.result == "proved" for s in steps)
        return Proof(
            prop, names, "induction", "proved" if ok else "unknown", steps, time.perf_counter() - t0
        )


@functools.cache
def shared_prover(src_tp: int) -> Prover:
    """One ``Prover`` per TP degree per process: its terms (hypotheses, goals, each
    transition) are built once and shared by every proof of that degree, which is most
    of a proof's cost (Fencing at TP 2: 2.1 CPU s with a new prover, 0.3 s with one that
    built them). A prover keeps no verdict, each query has its own solver, so sharing
    it changes no proof."""
    return Prover(src_tp)
