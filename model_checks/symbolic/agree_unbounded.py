"""Agreement of the unbounded model (``z3_unbounded``) with the explicit spec.

The induction proofs are about ``UModel``, whose frame, message array and ghost
counters are its own. This check pins it to the spec on concrete states: the symbolic
config is fixed to a finite config's values, the requests of a state ``w`` become
distinct constants of the sort, their fields, messages (every slot that can exist in
the config: the probes) and counters take ``w``'s values, and for every transition of
the model (each action, each request, each message in flight, each worker) z3 either
finds the unique successor, which must be the spec's ``apply`` result, or answers
unsat, and the spec must refuse that step.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import z3

from model_checks.symbolic.actions import GLOBAL
from model_checks.symbolic.agree import random_states
from model_checks.symbolic.core import Msg, Z
from model_checks.symbolic.unbounded import (
    REQ,
    UFIELDS,
    Probe,
    UAction,
    UModel,
    UState,
    contributions,
)
from spec.actions import apply
from spec.config import Config
from spec.state import NONE, Req, World, msg, msg_epoch, msg_idx, msg_kind

KINDS = (*range(1, 10), 13)  # 13: ChunkUnstaged (spec.state.M_CHUNK_UNSTAGED)


@dataclass
class UReport:
    config: str
    states: int = 0
    checks: int = 0
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0


class UChecker:
    def __init__(self, c: Config) -> None:
        if c.identity or c.slots:
            raise ValueError(
                f"config {c.name}: the unbounded model covers worlds without staging"
                " (identity) and without a metadata slot (slots)"
            )
        self.c = c
        self.m = UModel(c.src_tp)
        p = self.m.params
        self.reqs = [z3.Const(f"r{j}", REQ) for j in range(c.n_reqs)]
        self.width = c.src_tp * c.blocks
        self.probes: list[Probe] = [
            (r, k, e, i)
            for r in self.reqs
            for k in KINDS
            for e in range(0, c.max_attempts + 1)
            for i in range(max(self.width, c.src_tp, c.prefix + 1))
        ]
        fixed: list[Z] = [
            p.blocks == c.blocks,
            p.cap_p == c.cap_p,
            p.cap_d == c.cap_d,
            p.cap_h == c.cap_h,
            p.prefix == c.prefix,
            p.faults == c.faults,
            p.max_attempts == c.max_attempts,
            p.max_moves == c.max_moves,
            p.handoff == c.handoff,
            p.offload == c.offload,
            p.recompute == c.recompute,
            p.cancel == c.cancel,
            p.async_steps == c.async_steps,
            p.revocable == c.revocable,
            p.decode_failure == c.decode_failure,
            p.turns == c.turns,
            p.max_turns == c.max_turns,
        ]
        fixed += [v == (k in c.fault_kinds) for k, v in p.fault_kinds.items()]
        if len(self.reqs) > 1:
            fixed.append(z3.Distinct(*self.reqs))
        self.fixed = fixed
        self.s, self.t = self.m.state("pre"), self.m.state("post")
        # each (transition, request slot, argument) built once for every state checked
        self._trans: dict[tuple[UAction, int, int], Z] = {}

    def trans(self, act: UAction, j: int, arg: int) -> Z:
        """The model's transition ``act`` by request slot ``j`` (consuming message ``arg``)
        from ``self.s`` to ``self.t``, built once per checker."""
        key = (act, j, arg)
        tr = self._trans.get(key)
        if tr is None:
            a = Msg(act.kind, msg_epoch(arg), msg_idx(arg)) if act.kind is not None else None
            tr = self._trans[key] = self.m.trans(act, self.s, self.t, self.reqs[j], a, self.probes)
        return tr

    def _landed(self, mask: int) -> Z:
        arr: Z = z3.K(z3.IntSort(), z3.BoolVal(False))
        for b in range(self.width):
            if mask >> b & 1:
                arr = z3.Store(arr, b, True)
        return arr

    def pin(self, s: UState, w: World) -> list[Z]:
        """``s`` is ``w`` (at the requests and the probed slots)."""
        out: list[Z] = []
        for r, rec in zip(self.reqs, w.reqs, strict=True):
            for f in UFIELDS:
                v = getattr(rec, f)
                out.append(s.f[f][r] == (self._landed(v) if f == "landed" else v))
        for r, k, e, i in self.probes:
            out.append(s.net[r, k, e, i] == w.reqs[self.reqs.index(r)].net.count(msg(k, e, i)))
        out += [s.g[g] == getattr(w, g) for g in s.g]
        views = [self.m.view(s, r) for r in self.reqs]
        for name, var in s.k.items():
            total = sum(z3.simplify(contributions(self.m.params, v)[name]) for v in views)
            out.append(var == total)
        return out

    def read(self, model: Any, t: UState) -> World:
        def val(term: Z) -> int:
            v = model.eval(term, model_completion=True)
            return int(z3.is_true(v)) if z3.is_bool(v) else int(v.as_long())

        reqs = []
        for r in self.reqs:
            rec = {f: val(t.f[f][r]) for f in UFIELDS if f != "landed"}
            rec["landed"] = sum(1 << b for b in range(self.width) if val(t.f["landed"][r][b]))
            net: list[int] = []
            for pr, k, e, i in self.probes:
                if pr is r:
                    net += [msg(k, e, i)] * val(t.net[pr, k, e, i])
            reqs.append(Req(**rec, net=tuple(sorted(net))))
        g = {n: val(v) for n, v in t.g.items()}
        return World(
            reqs=tuple(reqs),
            faults=g["faults"],
            p_up=bool(g["p_up"]),
            d_up=bool(g["d_up"]),
            pfx=bool(g["pfx"]),
            pfx_ref=g["pfx_ref"],
            pfx_ok=bool(g["pfx_ok"]),
        )

    def labels(self, w: World) -> list[tuple[UAction, int, int]]:
        """Every (transition, request slot, argument) the model has from ``w``."""
        out: list[tuple[UAction, int, int]] = []
        for act in self.m.actions():
            if act.worker is not None:
                out.append((act, 0, act.worker))
            elif act.name in GLOBAL:
                out.append((act, 0, 0))
            elif act.kind is None:
                out += [(act, j, 0) for j in range(len(self.reqs))]
            else:
                for j, rec in enumerate(w.reqs):
                    codes = sorted({code for code in rec.net if msg_kind(code) == act.kind})
                    out += [(act, j, code) for code in codes]
        return out

    def check_state(self, w: World, rep: UReport) -> None:
        s, t = self.s, self.t
        solver = z3.Solver()
        solver.add(*self.fixed, *self.pin(s, w))
        for act, j, arg in self.labels(w):
            rep.checks += 1
            solver.push()
            solver.add(self.trans(act, j, arg))
            verdict = solver.check()
            want = apply(w, self.c, frozenset(), act.name, j, arg)
            where = f"{act.label} req {j} arg {arg:#x} at {w}"
            if verdict == z3.sat:
                model = solver.model()
                got = self.read(model, t)
                counters = {
                    n: model.eval(v, model_completion=True).as_long() for n, v in t.k.items()
                }
                if not isinstance(want, World) or got != want:
                    rep.mismatches.append(f"{where}: model gives {got}, spec {want}")
                elif counters != ghost_counters(self.c, got):
                    rep.mismatches.append(f"{where}: ghost counters {counters} after the step")
                else:
                    solver.add(z3.Not(z3.And(*self.pin(t, got))))
                    if solver.check() != z3.unsat:
                        rep.mismatches.append(f"{where}: more than one successor")
            elif isinstance(want, World):
                rep.mismatches.append(f"{where}: model refuses, spec gives {want}")
            solver.pop()
        rep.states += 1


def ghost_counters(c: Config, w: World) -> dict[str, int]:
    """What each ghost counter of ``UModel`` counts, in a concrete state."""
    rs = w.reqs
    return {
        "used_p": sum(c.blocks for r in rs if r.p != NONE),
        "used_h": sum(c.blocks for r in rs if r.h != NONE),
        "used_d_own": sum(c.blocks - r.hit for r in rs if r.d != NONE),
        "refs": sum(1 for r in rs if r.d != NONE and r.hit > 0),
    }


def check_unbounded(c: Config, n: int = 8, seed: int = 0) -> UReport:
    """``n`` random reachable states of ``c``, every transition from each."""
    t0 = time.perf_counter()
    rep = UReport(c.name)
    ck = UChecker(c)
    for w in random_states(c, frozenset(), n, random.Random(f"u{seed}:{c.name}")):
        ck.check_state(w, rep)
    rep.seconds = time.perf_counter() - t0
    return rep
