"""The ``spec`` mutation target: one-edit mutants of the spec's actions, judged by the
model check alone (``kvown mutate --target spec``).

Files: ``spec/actions_prefill.py``, ``spec/actions_decode.py``, ``spec/actions_env.py``
and the helpers they share (``spec/common.py``). Left out, as dead code rather than
spec: the branches that only a known mutant's switch enters (``if "name" in m:``, and
the ``else`` of ``if "name" not in m:``). An edit of the switch test itself is kept: it
turns a known bug on, and the checks must catch it.

Judge: ``python -m model_checks.mutation.spec_check --suite S --coverage`` in the
mutant's copy; exit 0 (every property holds on every config of S, and every action
fires somewhere) means the mutant survived.

Equivalents: ``spec/equivalent_mutants.json``, ``{id: reason}``, reviewed by hand.
"""

from __future__ import annotations

import ast
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from model_checks.mutation.equivalents import load_equivalents
from model_checks.mutation.operators import Mutant, generate, sample
from model_checks.mutation.runner import SURVIVED, Check, MutantResult, run_mutants, summarise
from model_checks.mutation.spec_check import order
from model_checks.mutation.spec_coverage import covered_lines, uncovered
from model_checks.mutation.spec_prefilter import Reachable, changes_a_step

ROOT = Path(__file__).resolve().parents[2]
FILES = (
    "spec/actions_prefill.py",
    "spec/actions_decode.py",
    "spec/actions_env.py",
    "spec/common.py",
)
EQUIVALENTS = ROOT / "spec" / "equivalent_mutants.json"
COPY = ("spec", "model_checks")
UNCHANGED = "survived: no reachable step of the suite differs (prefilter)"
NOT_COVERED = "survived: not covered (no config of the suite executes its line)"


def _switch(test: ast.expr) -> bool | None:
    """True for ``"name" in m``, False for ``"name" not in m``, None for anything else."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, right = test.left, test.comparators[0]
    if not (isinstance(left, ast.Constant) and isinstance(left.value, str)):
        return None
    if not (isinstance(right, ast.Name) and right.id == "m"):
        return None
    if isinstance(test.ops[0], ast.In):
        return True
    return False if isinstance(test.ops[0], ast.NotIn) else None


def _lines(stmts: Sequence[ast.stmt]) -> set[int]:
    out: set[int] = set()
    for s in stmts:
        out.update(range(s.lineno, (s.end_lineno or s.lineno) + 1))
    return out


def dead_lines(source: str) -> set[int]:
    """Lines only a known mutant's switch reaches (see the module doc)."""
    out: set[int] = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.If):
            sw = _switch(n.test)
            if sw is True:
                out |= _lines(n.body)
            elif sw is False:
                out |= _lines(n.orelse)
        elif isinstance(n, ast.IfExp):
            sw = _switch(n.test)
            if sw is not None:
                dead = n.body if sw else n.orelse
                if dead.lineno == (dead.end_lineno or dead.lineno) == n.test.lineno:
                    continue  # one line: a line filter cannot tell the branches apart
                out.update(range(dead.lineno, (dead.end_lineno or dead.lineno) + 1))
    return out


def mutants(root: Path = ROOT) -> list[Mutant]:
    """Every generated mutant of FILES outside the known-mutant branches, sorted by id."""
    dead = {f: dead_lines((root / f).read_text(encoding="utf-8")) for f in FILES}
    return [m for m in generate(root, FILES) if m.line not in dead[m.file]]


def checks(suites: Sequence[str], timeout_s: float, coverage: bool = False) -> tuple[Check, ...]:
    argv = [sys.executable, "-m", "model_checks.mutation.spec_check"]
    if coverage:
        argv.append("--coverage")
    for s in suites:
        argv += ["--suite", s]
    return (Check("model-check", tuple(argv), timeout_s=timeout_s),)


def run(
    suites: Sequence[str] = ("default",),
    *,
    n: int = 120,
    seed: int = 0,
    jobs: int = 2,
    timeout_s: float = 900.0,
    root: Path = ROOT,
    only: Sequence[str] = (),
    prefilter: bool = True,
    coverage: bool = True,
    on_result: Callable[[MutantResult], None] | None = None,
    on_start: Callable[[], None] | None = None,
    skip_uncovered: bool = False,
    say: Callable[[str], None] | None = None,
) -> tuple[dict[str, object], list[MutantResult]]:
    """Sample ``n`` mutants (``only``: these ids instead), judge each, summarise.

    ``skip_uncovered``: a mutant on a line no config of the suites executes (line
    coverage of the correct spec, ``spec_coverage``, measured once and cached) survives
    without a run, reported as not covered. ``prefilter``: first explore the correct
    suite once, and let a mutant that changes no reachable step survive without a model
    check of its own (``spec_prefilter``); the others run in subprocesses, ``jobs`` at a
    time, while the next is filtered. ``say``: the plan's lines, as each step starts;
    ``on_start``: called once the one-off work (coverage, the prefilter's exploration) is
    done and the mutants' own work starts (a progress measures its rate from there)."""
    pool = mutants(root)
    if only:
        known = {m.id: m for m in pool}
        missing = [i for i in only if i not in known]
        if missing:
            raise ValueError(f"unknown spec mutant ids: {', '.join(missing)}")
        picked = [known[i] for i in only]
    else:
        picked = sample(pool, n, seed)
    cs = checks(suites, timeout_s, coverage)
    say = say or (lambda _: None)
    configs = order(list(suites))
    say(f"configs, smallest first (a mutant stops at the first that breaks): {', '.join(configs)}")
    skip: set[str] = set()
    if skip_uncovered:
        t0 = time.monotonic()
        hit, cached = covered_lines(root, FILES, configs)
        skip = uncovered(root, picked, hit)
        how = "cached" if cached else f"measured in {time.monotonic() - t0:.0f} s"
        say(
            f"line coverage of the spec by {', '.join(suites)} ({how}): {len(skip)} of"
            f" {len(picked)} mutants on lines no config executes, reported without a run"
        )
    if prefilter:
        say("prefilter: exploring the correct suite once; a mutant that changes no step survives")
    reach = Reachable(configs) if prefilter else None
    if on_start is not None:
        on_start()
    done: dict[str, MutantResult] = {}

    def judge(m: Mutant) -> None:
        (res,) = run_mutants(root, [m], cs, copy=COPY, jobs=1)
        done[m.id] = res
        if on_result is not None:
            on_result(res)

    workers = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = []
        for m in picked:
            if m.id in skip:
                res = MutantResult(m, {cs[0].name: SURVIVED}, {cs[0].name: NOT_COVERED})
                done[m.id] = res
                if on_result is not None:
                    on_result(res)
                continue
            if reach is not None and changes_a_step(m, reach) is False:
                res = MutantResult(m, {cs[0].name: SURVIVED}, {cs[0].name: UNCHANGED})
                done[m.id] = res
                if on_result is not None:
                    on_result(res)
                continue
            futures.append(workers.submit(judge, m))
        for f in futures:
            f.result()
    finally:  # an interrupt: the queued mutants never start
        workers.shutdown(wait=True, cancel_futures=True)
    results = [done[m.id] for m in picked]
    report = summarise(results, load_equivalents(EQUIVALENTS), cs)
    report["generated"] = len(pool)
    report["suites"] = list(suites)
    report["unchanged"] = sum(1 for r in results if r.details.get(cs[0].name) == UNCHANGED)
    report["not_covered"] = sum(1 for r in results if r.details.get(cs[0].name) == NOT_COVERED)
    return report, results
