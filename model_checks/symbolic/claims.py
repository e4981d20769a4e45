"""Every claim ``kvown prove`` makes, as independent tasks (run in parallel processes).

Claim ids: a safety property ID (induction over any number of requests, blocks and
capacity, for each src_tp 1..4: one task per src_tp, merged per property),
``mutant:NAME`` (BMC finds the violation at the BFS depth: expected "violated"),
``bmc:CONFIG`` (the correct spec: no violation up to the bound), and the
``layout:...`` claims of ``layout_proofs``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from model_checks.symbolic.bmc import (
    CORRECT_DEPTH,
    SAFETY_MUTANTS,
    bfs_depth,
    correct_bmc,
    mutant_bmc,
)
from model_checks.symbolic.induction import CTI, Proof, shared_prover
from model_checks.symbolic.invariants import SUPPORT
from spec.properties import SAFETY

TPS = (1, 2, 3, 4)  # every src_tp a Config allows (chunk indices need it concrete)


@dataclass
class Claim:
    id: str
    method: str  # "bmc", "induction", "k-induction" or "bijection"
    result: str  # "proved", "violated" or "unknown"
    seconds: float
    expected: str  # the result that makes the claim hold
    detail: str = ""
    ok: bool = False
    cti: list[str] = field(default_factory=list)  # rendered lines, when induction failed

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 3)
        return d


def _proof_claim(cid: str, proof: Proof, tp: int) -> Claim:
    n = len(proof.steps)
    detail = f"init + {n - 1} transitions; {len(proof.conjuncts) - 1} support conjuncts"
    c = Claim(cid, proof.method, proof.result, proof.seconds, "proved", detail)
    bad = [s for s in proof.steps if s.result != "proved"]
    if bad:
        c.detail = f"src_tp={tp}: not inductive at {', '.join(s.action for s in bad[:4])}"
        cti: CTI | None = proof.cti
        if cti is not None:
            c.cti = cti.render().splitlines()
    c.ok = c.result == c.expected
    return c


def induction_claims(
    tp: int, pids: tuple[str, ...] = (), drop: tuple[str, ...] = ()
) -> list[Claim]:
    """Each property (or ``pids``) with its support, minus ``drop``, at one src_tp."""
    pv = shared_prover(tp)
    out = []
    for pid in pids or tuple(p.id for p in SAFETY):
        names = [n for n in (pid, *SUPPORT[pid]) if n not in drop]
        out.append(_proof_claim(pid, pv.proof(pid, names), tp))
    return out


def merge_tps(claims: list[Claim]) -> list[Claim]:
    """One claim per property: proved at every src_tp; seconds summed."""
    by: dict[str, list[Claim]] = {}
    for c in claims:
        by.setdefault(c.id, []).append(c)
    out = []
    for cid, cs in by.items():
        bad = [c for c in cs if not c.ok]
        first = bad[0] if bad else cs[0]
        m = Claim(cid, "induction", first.result, sum(c.seconds for c in cs), "proved")
        m.detail = (
            f"src_tp {','.join(str(t) for t in TPS)}: {first.detail}" if not bad else first.detail
        )
        m.cti, m.ok = first.cti, not bad
        out.append(m)
    return out


def mutant_claim(name: str) -> Claim:
    t0 = time.perf_counter()
    res = mutant_bmc(name)
    want = bfs_depth(name)
    c = Claim(f"mutant:{name}", "bmc", "unknown", 0.0, "violated")
    if res.depth is not None:
        c.result = "violated"
        c.detail = f"{res.config}: {res.violated[0] if res.violated else '?'} at depth {res.depth}"
        c.detail += f" (BFS {want})"
    else:
        c.detail = f"{res.config}: no violation up to depth {res.bound} (BFS {want})"
    c.ok = c.result == "violated" and res.depth == want and bool(res.violated)
    c.seconds = time.perf_counter() - t0
    return c


def correct_claim(config: str) -> Claim:
    res = correct_bmc(config)
    found = res.depth is not None
    c = Claim(f"bmc:{config}", "bmc", "violated" if found else "proved", res.seconds, "proved")
    c.detail = (
        f"no violation in {res.bound} steps" if not found else f"{res.violated} at {res.depth}"
    )
    c.ok = not found and res.bound == CORRECT_DEPTH[config]
    return c


def layout_claims_all(quick: bool = False) -> list[Claim]:
    from model_checks.layouts.proofs import layout_claims

    out = []
    for lc in layout_claims(quick):
        want = "violated" if lc.id.startswith("layout:bug:") else "proved"
        out.append(
            Claim(lc.id, lc.method, lc.result, lc.seconds, want, lc.detail, lc.result == want)
        )
    return out


# -- the task list --------------------------------------------------------------------
Task = tuple[str, tuple[Any, ...]]  # (function name in this module, arguments)
GROUPS = ("induction", "bmc", "layout")


def tasks(groups: Iterable[str] = GROUPS, quick: bool = False) -> list[Task]:
    """Longest first (so that a pool of workers balances)."""
    gs = set(groups)
    out: list[Task] = []
    if "bmc" in gs:
        out += [("mutant_claim", (n,)) for n in SAFETY_MUTANTS]
        out += [("correct_claim", (n,)) for n in CORRECT_DEPTH]
    if "induction" in gs:
        out += [("induction_claims", (tp,)) for tp in TPS]
    if "layout" in gs:
        out.append(("layout_claims_all", (quick,)))
    weight = {"mutant_claim": 2, "layout_claims_all": 3, "induction_claims": 1}
    deep = {"source_resumes_on_timeout", "error_overwritten", "cancel_ignored"}
    out.sort(key=lambda t: -(weight.get(t[0], 0) + (3 if t[1] and t[1][0] in deep else 0)))
    return out


def run_task(task: Task) -> list[Claim]:
    fn: Callable[..., Any] = globals()[task[0]]
    res = fn(*task[1])
    return res if isinstance(res, list) else [res]


def run_all(
    groups: Iterable[str] = GROUPS,
    quick: bool = False,
    jobs: int = 1,
    on_done: Callable[[list[Claim]], None] | None = None,
) -> list[Claim]:
    """Every claim of ``groups``; ``jobs`` worker processes (1: in this process)."""
    todo = tasks(groups, quick)
    out: list[Claim] = []
    if jobs <= 1:
        results: Iterable[list[Claim]] = map(run_task, todo)
        for got in results:
            out += got
            if on_done is not None:
                on_done(got)
    else:
        ctx = multiprocessing.get_context("fork")  # z3 starts no threads here: fork is safe
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            for got in pool.map(run_task, todo):
                out += got
                if on_done is not None:
                    on_done(got)
    proofs = [c for c in out if c.method == "induction"]
    return merge_tps(proofs) + [c for c in out if c.method != "induction"]
