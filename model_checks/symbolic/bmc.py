"""Bounded model checking of the spec with z3 (Programming Z3, section 5.5, "bmc").

System.  ``z3_encoding.Encoding``: <init, trans, bad> of one config under a set of
mutants. The unrolling is incremental: step k adds ``step(s_k, s_k+1, sel_k)`` and asks
whether ``bad(s_k)`` is satisfiable (one solver; the bad state is an assumption), so the
first depth that answers sat is the length of a shortest counterexample, the same
number the explorer's BFS reports. Bit-vector state, ``QF_FD`` solver (bit-blasting
onto z3's incremental SAT core: an order of magnitude faster here than the SMT core).

Properties.  A mutant is checked against the property it must break
(``spec.mutants``); the correct spec against all 12 safety properties at once. Liveness
mutants (``zero_block_never_done``, ``sweep_only_on_admit``, ``no_timeout_while_filling``)
break a liveness property: a lasso, not a bounded path to a bad state, so they are out
of BMC's scope (the explorer checks them on the state graph).

Harness.  ``bmc(...)`` returns a ``BmcResult`` whose ``steps`` are in the one trace
format (``[{action, args}]`` via ``spec.actions.encode_args``) and replay on the
explicit spec (``model_checks.explicit.trace.replay``); ``mutant_bmc(name)`` and
``correct_bmc(config, depth)`` are what ``kvown prove`` runs.
"""

from __future__ import annotations

import functools
import json
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from model_checks.explicit.trace import Step, replay
from model_checks.symbolic.core import A, N, O, Z
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.finite import FCtx, FState
from model_checks.symbolic.invariants import STRENGTHENING
from model_checks.symbolic.tracer.predicate import ActionRead, step_part, step_part_at
from model_checks.symbolic.tracer.symstate import TraceError
from spec.actions import decode_args, encode_args
from spec.config import Config, get_config
from spec.invariants import INVARIANTS
from spec.mutants import MUTANTS, get_mutant
from spec.properties import PROPERTIES, SAFETY
from spec.state import World
from spec.steps import STEP_PREDS, check_step

SAFETY_IDS = tuple(p.id for p in SAFETY)
# Every safety mutant is BMC's (one whose step changes another request than the one it is
# about, ``slot_reused_unfenced``, is traced on every request: ``tracer.trace``).
SAFETY_MUTANTS = tuple(
    n
    for n, m in MUTANTS.items()
    if m.expected in INVARIANTS or PROPERTIES[m.expected].kind == "safety"
)
LIVENESS_MUTANTS = tuple(
    n
    for n, m in MUTANTS.items()
    if m.expected in PROPERTIES and PROPERTIES[m.expected].kind == "liveness"
)

# Correct-spec bound K per default config: the deepest unrolling that answers in a
# few seconds on the 2-core reference machine (see benchmarks/prove_bench.py).
# offload_contend's bound is its diameter (the BFS depth, 22): there BMC is exhaustive.
CORRECT_DEPTH: dict[str, int] = {
    "handoff_tp2to1": 15,
    "handoff_crash": 16,
    "offload_contend": 22,
    "prefix_share": 13,
    "handoff_two": 15,
    "handoff_unrevocable": 12,
    "handoff_decode_fail": 12,
}


@dataclass
class BmcResult:
    config: str
    mutants: frozenset[str]
    props: tuple[str, ...]  # the properties whose violation was searched for
    depth: int | None  # the first depth with a violation; None: none up to ``bound``
    bound: int  # the deepest depth checked
    violated: list[str] = field(default_factory=list)  # at ``depth``, per the spec
    steps: list[Step] = field(default_factory=list)  # the counterexample trace
    seconds: float = 0.0
    depth_seconds: list[float] = field(default_factory=list)  # elapsed when depth k done

    def trace_json(self) -> dict[str, Any]:
        mut = ",".join(sorted(self.mutants)) or None
        v = self.violated[0] if self.violated else None
        return {"config": self.config, "mutant": mut, "violated": v, "trace": self.steps}


@functools.lru_cache(maxsize=8)
def shared_encoding(c: Config, mutants: frozenset[str] = frozenset()) -> Encoding:
    """One ``Encoding`` of (config, mutants) per process, for the readers that only build
    formulas from it (``bmc``, ``agree.Checker``): building one traces every action from
    the spec (2.8 CPU s on handoff_tp2to1), and a mutant's BMC and agreement tests (or a
    config's) built the same one twice. Its states are named by their tags and its caches
    are keyed by them, so sharing it changes no formula."""
    return Encoding(c, mutants)


def bmc(
    c: Config,
    mutants: frozenset[str],
    props: Sequence[str],
    max_depth: int,
    *,
    deadline_s: float | None = None,
) -> BmcResult:
    """Unroll until ``bad`` (a violation of any of ``props``) is satisfiable, up to
    ``max_depth`` steps (or until ``deadline_s`` seconds have passed)."""
    t0 = time.perf_counter()
    enc = shared_encoding(c, frozenset(mutants))
    solver = z3.SolverFor("QF_FD")
    states = [enc.state("0")]
    solver.add(enc.init(states[0]))
    sels: list[Z] = []
    sel_bits = max(1, len(enc.subs).bit_length())
    res = BmcResult(c.name, frozenset(mutants), tuple(props), None, -1)
    for k in range(max_depth + 1):
        flag = z3.Bool(f"bad@{k}")
        bad = [_bad(enc, p, states[k]) for p in props]
        if k:  # the last step breaks a transition predicate (spec/steps.py)
            bad += [_bad_step(enc, p, states[k - 1], states[k], sels[k - 1]) for p in props]
        solver.add(z3.Implies(flag, O(*bad)))
        verdict = solver.check(flag)
        res.bound = k
        res.depth_seconds.append(time.perf_counter() - t0)
        if verdict == z3.sat:
            res.depth = k
            res.steps = _trace(enc, solver.model(), sels)
            break
        if verdict != z3.unsat:
            raise RuntimeError(f"bmc {c.name} depth {k}: z3 answered {verdict}")
        if k == max_depth or (deadline_s is not None and time.perf_counter() - t0 > deadline_s):
            break
        nxt = enc.state(str(k + 1))
        sel = z3.BitVec(f"sel@{k}", sel_bits)
        solver.add(enc.step_fast(states[k], nxt, sel))
        states.append(nxt)
        sels.append(sel)
    if res.depth is not None:
        res.violated = _check_replay(c, frozenset(mutants), res.steps, props)
    res.seconds = time.perf_counter() - t0
    return res


def _bad(enc: Encoding, prop: str, s: FState) -> Z:
    """``prop`` (a property, or a request/global conjunct of INVARIANTS.md) broken in ``s``."""
    if prop not in INVARIANTS:
        return enc.bad(prop, s)
    j, x = STRENGTHENING[prop], FCtx(enc, s)
    if j.req is None and j.glob is None:
        raise ValueError(f"{prop}: a slot conjunct, not encoded for BMC")
    if j.glob is not None:
        return N(j.glob(x))
    assert j.req is not None
    return N(A(*(j.req(x, enc.view(s, i)) for i in range(enc.c.n_reqs))))


@functools.cache
def _step_parts(prop: str) -> tuple[tuple[Any, Any], ...]:
    """The transition predicates of ``prop``: (spec predicate, its trace over the two
    states, ``tracer.predicate.step_part``)."""
    return tuple((fn, step_part(fn)) for pid, fn in STEP_PREDS if pid == prop)


def _bad_step(enc: Encoding, prop: str, s: FState, t: FState, sel: Z) -> Z:
    """The step from ``s`` to ``t`` (instance ``sel`` of ``enc.subs``) breaks one of
    ``prop``'s transition predicates. One that reads the action is traced per action
    instance on template states (``_by_instance``) and renamed onto this step."""
    x0, x1 = FCtx(enc, s), FCtx(enc, t)
    out = []
    for fn, f in _step_parts(prop):
        try:
            out.append(N(f(x0, x1)))
            continue
        except ActionRead:
            inst = _by_instance(enc, fn, sel)
        except TraceError:  # more than the tracer follows: the explorer's
            continue
        if inst is not None and inst[3] is not False:
            a, b, tsel, term = inst
            pairs = [(a.v[k], s.v[k]) for k in a.v] + [(b.v[k], t.v[k]) for k in b.v]
            out.append(z3.substitute(term, *pairs, (tsel, sel)))
    return O(*out)


_Term = tuple[FState, FState, Z, Z]  # template states, selector, the broken predicate
_BY_INSTANCE: weakref.WeakKeyDictionary[Encoding, dict[Any, _Term | None]] = (
    weakref.WeakKeyDictionary()
)


def _by_instance(enc: Encoding, fn: Any, sel: Z) -> _Term | None:
    """``fn`` (a transition predicate that reads the action) broken by the step taken,
    over template states and selector: for each action instance, the selector at one of
    its parts and the predicate traced with that instance's name, slot and argument.
    None where the tracer does not follow it (the explorer's alone)."""
    memo = _BY_INSTANCE.setdefault(enc, {})
    if fn in memo:
        return memo[fn]
    memo[fn] = None
    try:
        a, b = enc.state(f"stp_a_{fn.__name__}"), enc.state(f"stp_b_{fn.__name__}")
        tsel = z3.BitVec(f"stp_sel_{fn.__name__}", sel.size())
        x0, x1 = FCtx(enc, a), FCtx(enc, b)
        at: dict[Any, list[int]] = {}
        for idx, u in enumerate(enc.subs):
            at.setdefault(u.inst, []).append(idx)
        out = []
        for inst, idxs in at.items():
            ok = step_part_at(fn, inst.name, inst.i, inst.arg)(x0, x1)
            if ok is not True:
                out.append(A(O(*(tsel == j for j in idxs)), N(ok)))
    except TraceError:
        return None
    term = memo[fn] = (a, b, tsel, O(*out))
    return term


def _trace(enc: Encoding, model: Any, sels: list[Z]) -> list[Step]:
    steps: list[Step] = []
    for sel in sels:
        k = enc.subs[model.eval(sel, model_completion=True).as_long()].inst
        steps.append({"action": k.name, "args": encode_args(k.name, k.i, k.arg)})
    return steps


def _check_replay(
    c: Config, m: frozenset[str], steps: list[Step], props: Sequence[str]
) -> list[str]:
    """Replay on the explicit spec (raises TraceError if a step is refused) and return
    the properties of ``props`` the final state breaks."""
    worlds = replay(c, m, steps)
    final = worlds[-1]
    broken = set(last_step_broken(c, steps, worlds))
    return [p for p in props if not _pred(p)(final, c) or p in broken]


def last_step_broken(c: Config, steps: list[Step], worlds: list[World]) -> list[str]:
    """The properties whose transition predicate the last step of a replay breaks."""
    if not steps:
        return []
    name = steps[-1]["action"]
    i, arg = decode_args(name, steps[-1]["args"])
    return check_step(worlds[-2], name, i, arg, worlds[-1], c)


def _pred(pid: str) -> Any:
    if pid in INVARIANTS:  # a mutant caught by a conjunct of INVARIANTS.md (BMC checks it too)
        return INVARIANTS[pid].pred
    pred = PROPERTIES[pid].pred
    assert pred is not None
    return pred


def bfs_depth(name: str) -> int | None:
    """The pinned BFS shortest-counterexample length of a mutant (spec/pinned.json)."""
    from model_checks.explicit.pin import PINNED

    data = json.loads(PINNED.read_text())
    v = data.get("mutants", {}).get(name, {}).get("trace_length")
    return int(v) if isinstance(v, int) else None


def mutant_bmc(name: str, max_depth: int | None = None) -> BmcResult:
    """BMC of a safety mutant on its first config, for its expected property."""
    mu = get_mutant(name)
    if name not in SAFETY_MUTANTS:
        raise ValueError(f"{name} breaks {mu.expected}, a liveness property: not a BMC claim")
    pinned = bfs_depth(name)
    bound = max_depth if max_depth is not None else (pinned + 2 if pinned is not None else 40)
    return bmc(get_config(mu.configs[0]), frozenset({name}), (mu.expected,), bound)


def correct_bmc(config: str, depth: int | None = None) -> BmcResult:
    """The correct spec: no safety property violated up to ``depth`` steps."""
    k = depth if depth is not None else CORRECT_DEPTH[config]
    return bmc(get_config(config), frozenset(), SAFETY_IDS, k)
