"""Agreement of the z3 encoding with the explicit spec (two encodings, one truth).

Two checks, both per action label ``(name, request slot, argument)``, with no symmetry
reduction (request slots are concrete on both sides):

(a) edges: every explicit edge ``w --label--> w2`` satisfies that label's z3
    transition ``Encoding.action`` (the explicit-frame form), evaluated by z3 at the
    concrete pair of states;
(b) successors: from a concrete state ``w``, z3 enumerates every model of
    ``Encoding.step`` (the compact selector form that BMC unrolls): the set of
    ``(label, successor)`` pairs must equal what ``spec.actions.successors`` lists.

States come from a full exploration of the tiny configs below (every state, every
edge) and from random walks on the default configs and on each mutant's config
(a sample). ``python -m model_checks.symbolic.agree`` prints a summary. The unbounded model
of the induction proofs has its own check, ``z3_agree_unbounded``.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from model_checks.explicit.explore import explore
from model_checks.symbolic.bmc import shared_encoding
from model_checks.symbolic.finite import FState, Inst, conj
from spec.actions import successors
from spec.config import CONFIGS, Config
from spec.mutants import MUTANTS
from spec.state import World

# Tiny configs, small enough to check every reachable state (not in spec/config.py:
# they exist only to cover the encoding's features cheaply).
TINY: dict[str, Config] = {
    c.name: c
    for c in (
        Config(
            name="z3_tiny_faults",
            doc="TP 2->1, 1 block, a corrupt chunk or a bad manifest",
            src_tp=2,
            blocks=1,
            cap_p=1,
            cap_d=1,
            cancel=False,
            faults=1,
            fault_kinds=frozenset({"corrupt", "mismatch"}),
            max_attempts=1,
        ),
        Config(
            name="z3_tiny_prefix_crash",
            doc="2 blocks, a 1-block prefix on decode, a worker crash",
            blocks=2,
            cap_p=2,
            cap_d=2,
            prefix=1,
            cancel=False,
            faults=1,
            fault_kinds=frozenset({"crash"}),
            max_attempts=1,
        ),
        Config(
            name="z3_tiny_offload",
            doc="two requests, offload/reload and recompute on a 1-block GPU",
            n_reqs=2,
            blocks=1,
            cap_p=1,
            cap_h=1,
            handoff=False,
            offload=True,
            recompute=True,
            faults=1,
            fault_kinds=frozenset({"store_fail"}),
        ),
    )
}

Label = tuple[str, int, int]
Succ = tuple[str, int, int, World]


@dataclass
class Mismatch:
    config: str
    mutants: frozenset[str]
    check: str  # "edge" or "successors"
    state: World
    detail: str

    def __str__(self) -> str:
        mut = f" [{','.join(sorted(self.mutants))}]" if self.mutants else ""
        return f"{self.config}{mut} {self.check}: {self.detail}\n  at {self.state}"


@dataclass
class Report:
    config: str
    mutants: frozenset[str]
    states: int = 0  # states whose successor sets were compared
    edges: int = 0  # edges checked against their action's transition
    mismatches: list[Mismatch] = field(default_factory=list)
    seconds: float = 0.0


class Checker:
    """The z3 side of one (config, mutants): a solver holding one ``step``."""

    def __init__(self, c: Config, mutants: frozenset[str] = frozenset()) -> None:
        self.c, self.m = c, frozenset(mutants)
        self.enc = shared_encoding(c, self.m)
        self.s, self.t = self.enc.state("pre"), self.enc.state("post")
        self.sel = z3.BitVec("sel", max(1, len(self.enc.subs).bit_length()))
        self.solver = z3.SolverFor("QF_FD")
        self.solver.add(self.enc.step(self.s, self.t, self.sel))
        self._actions: dict[Inst, Any] = {}
        self._vals: dict[tuple[str, Any, Any], tuple[Any, Any]] = {}

    def successors(self, w: World) -> set[Succ]:
        """Every (label, successor) z3 finds from ``w``."""
        enc, solver, out = self.enc, self.solver, set()
        solver.push()
        solver.add(*enc.eqs(self.s, w))
        while solver.check() == z3.sat:
            model = solver.model()
            j = model.eval(self.sel).as_long()
            k, nxt = enc.subs[j].inst, enc.world(model, self.t)
            out.add((k.name, k.i, k.arg, nxt))
            solver.add(z3.Not(conj([self.sel == j, *enc.eqs(self.t, nxt)])))
        solver.pop()
        return out

    def edge_holds(self, w: World, label: Label, w2: World) -> bool:
        """Does ``w --label--> w2`` satisfy the label's z3 transition?"""
        k = Inst(*label)
        f = self._actions.get(k)
        if f is None:
            f = self._actions[k] = self.enc.action(k, self.s, self.t)
        pairs = self._pairs(self.s, w) + self._pairs(self.t, w2)
        return bool(z3.is_true(z3.simplify(z3.substitute(f, *pairs))))

    def _pairs(self, s: FState, w: World) -> list[tuple[Any, Any]]:
        out = []
        cache = self._vals
        for key, v in self.enc.values(w).items():
            pair = cache.get((s.tag, key, v))
            if pair is None:
                var = s.v[key]
                val = z3.BoolVal(v) if z3.is_bool(var) else z3.BitVecVal(v, var.size())
                pair = cache[(s.tag, key, v)] = (var, val)
            out.append(pair)
        return out


def _labels(succ: Iterable[Succ]) -> list[str]:
    return sorted(f"{n}(req={i}, arg={a:#x})" for n, i, a, _ in succ)


def compare_states(ck: Checker, worlds: Iterable[World], rep: Report) -> None:
    for w in worlds:
        want = set(successors(w, ck.c, ck.m))
        got = ck.successors(w)
        rep.states += 1
        if got != want:
            extra, missing = got - want, want - got
            rep.mismatches.append(
                Mismatch(
                    ck.c.name,
                    ck.m,
                    "successors",
                    w,
                    f"z3 only: {_labels(extra)}; spec only: {_labels(missing)}",
                )
            )


def compare_edges(ck: Checker, edges: Iterable[tuple[World, Label, World]], rep: Report) -> None:
    for w, label, w2 in edges:
        rep.edges += 1
        if not ck.edge_holds(w, label, w2):
            rep.mismatches.append(
                Mismatch(ck.c.name, ck.m, "edge", w, f"{label} to {w2} violates the z3 action")
            )


def random_states(c: Config, m: frozenset[str], n: int, rng: random.Random) -> list[World]:
    """``n`` distinct reachable states from random walks (no exploration needed)."""
    seen: dict[World, None] = {c.initial(): None}
    walks = 0
    while len(seen) < 3 * n and walks < 20 * n:
        walks += 1
        w = c.initial()
        for _ in range(60):
            succ = list(successors(w, c, m))
            if not succ:
                break
            w = rng.choice(succ)[3]
            seen[w] = None
    pool = list(seen)
    return pool if len(pool) <= n else rng.sample(pool, n)


def check_full(c: Config, mutants: frozenset[str] = frozenset(), edges: bool = True) -> Report:
    """Every reachable state (and every edge) of a small config."""
    t0 = time.perf_counter()
    rep = Report(c.name, frozenset(mutants))
    g = explore(c, mutants, symmetry=False)
    ck = Checker(c, mutants)
    compare_states(ck, g.states, rep)
    if edges:
        lab = g.lab
        compare_edges(
            ck,
            (
                (g.states[s], lab[k], g.states[d])
                for k, (s, d) in enumerate(zip(g.src, g.dst, strict=True))
            ),
            rep,
        )
    rep.seconds = time.perf_counter() - t0
    return rep


def check_sample(
    c: Config, mutants: frozenset[str] = frozenset(), n: int = 40, seed: int = 0
) -> Report:
    """A random sample of reachable states of ``c``, and every edge leaving them."""
    t0 = time.perf_counter()
    rep = Report(c.name, frozenset(mutants))
    rng = random.Random(f"{seed}:{c.name}:{sorted(mutants)}")
    worlds = random_states(c, frozenset(mutants), n, rng)
    ck = Checker(c, mutants)
    compare_states(ck, worlds, rep)
    compare_edges(
        ck, ((w, (a, i, x), w2) for w in worlds for a, i, x, w2 in successors(w, c, ck.m)), rep
    )
    rep.seconds = time.perf_counter() - t0
    return rep


def run_all(sample: int = 40, mutant_sample: int = 12, seed: int = 0) -> list[Report]:
    """The agreement suite: tiny configs in full, default configs and mutants sampled."""
    reps = [check_full(c) for c in TINY.values()]
    reps += [check_sample(c, n=sample, seed=seed) for c in CONFIGS.values()]
    for name, mu in MUTANTS.items():
        reps.append(check_sample(CONFIGS[mu.configs[0]], frozenset({name}), mutant_sample, seed))
    return reps


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    sample = int(args[0]) if args else 40
    t0 = time.perf_counter()
    reps = run_all(sample)
    bad = 0
    for r in reps:
        mut = ",".join(sorted(r.mutants)) or "-"
        print(
            f"{r.config:22} {mut:28} states {r.states:5} edges {r.edges:6} "
            f"mismatches {len(r.mismatches):3} {r.seconds:6.2f}s"
        )
        for mm in r.mismatches[:3]:
            print("   ", mm)
        bad += len(r.mismatches)
    print(
        f"{sum(r.states for r in reps)} states, {sum(r.edges for r in reps)} edges, "
        f"{bad} mismatches in {time.perf_counter() - t0:.1f}s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
