"""``kvown mutate``: one-edit mutants of the code, each judged by the checkers.

    kvown mutate --target refimpl --sample 30          30 mutants (the same ones each run)
    kvown mutate --target refimpl --sample 30 --json   {"mutants", "killed", "equivalent",
                                                        "survivors": [{id, file, line, diff}],
                                                        "timed_out", "kill_rate", "by_check",
                                                        "results": [{id, check: [outcome,
                                                        its last line]}]}
    kvown mutate --target refimpl                      every mutant (the nightly run)
    kvown mutate --target refimpl --list               the mutants, not run
    kvown mutate --target spec --sample 120 --json     the spec's actions, each mutant judged
                                                       by the model check (--suite deep too)

``--target refimpl`` judges each mutant by the graph tour first (deterministic, fast),
then the fuzz run, and stops at the first check that kills it; with ``--skip-uncovered``,
a line tracer on the unmutated code first finds the mutants on lines no check executes:
those are reported as ``not_covered`` without a run (counted as survivors in the kill
rate; the trace takes minutes, so it is off by default). The report gives
``cpu_seconds_per_mutant`` (the checks' processes, summed).

A target names the files, the checks and the reviewed equivalents (``TARGETS``; see
``model_checks/mutation/target.py`` to add one). Each mutant runs in its own process on
a temporary copy of the repository, ``--jobs`` at a time.

Before it starts, a plan on stderr (how many mutants, checks, jobs), then an estimate of
the whole run from the first mutants measured; progress lines as each mutant ends (and,
in a log, at least once a minute); Ctrl-C prints the tally so far.

``--target spec`` generates one-edit mutants of the spec's actions from their source (AST
edits: drop a conjunct, negate or flip a comparison, shift a constant, drop an update,
swap two effects...), judges each by the model check of the chosen suites in its own
process; equivalent mutants are those on the reviewed list ``spec/equivalent_mutants.json``.
The configs run in increasing size and a mutant stops at the first violation (of a
property or an INVARIANTS.md conjunct); with ``--skip-uncovered``, a mutant on a line no
config executes (line coverage of the correct spec, measured once and cached: about 4 CPU
minutes the first time) is reported as not covered without a run; one that changes no
reachable step
survives without a run (the prefilter). The plan says each of these as it starts.

Exit codes: 0 the kill rate (killed / (killed + survived), equivalents and timeouts
apart) is at least ``--min-kill``; 1 it is below; 2 misuse.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from kvown_cli.progress import Progress, duration
from kvown_cli.usage import UsageError
from model_checks import children
from model_checks.mutation import Check, MutantResult, Target, run_mutants, sample, summarise
from model_checks.mutation.runner import MAX_JOBS
from spec.config import SUITES

HELP = "one-edit mutants of the code, each judged by the checkers"
TARGETS: dict[str, str] = {  # target name -> module with ``target(**options) -> Target``
    "refimpl": "refimpl.testing.mutate",
    "spec": "model_checks.mutation.spec_target",  # judged by the model check (_run_spec)
}
SPEC_SAMPLE = 120  # spec mutants sampled when --sample is not given


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="refimpl", help=f"one of {', '.join(TARGETS)}")
    p.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help=f"run N mutants (default: all for refimpl, {SPEC_SAMPLE} for spec)",
    )
    p.add_argument("--seed", type=int, default=0, help="which N")
    p.add_argument("--jobs", type=int, default=2, help=f"parallel mutants, 1..{MAX_JOBS}")
    p.add_argument(
        "--examples", type=int, metavar="N", help="fuzz examples per world (default: the target's)"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per check")
    p.add_argument("--no-unit", action="store_true", help="skip the unit-test column")
    p.add_argument("--min-kill", type=float, default=0.9, help="exit 1 below this kill rate")
    p.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--skip-uncovered",
        action="store_true",
        help="trace the lines the checks execute on the correct code first (minutes) and"
        " report the mutants on other lines as not covered, without a run (default: run all)",
    )
    spec = p.add_argument_group("--target spec")
    spec.add_argument(
        "--suite",
        choices=sorted(SUITES),
        action="append",
        help="suites that judge (repeatable; default: default)",
    )
    spec.add_argument("--only", metavar="ID", action="append", default=[], help="these mutant ids")
    spec.add_argument(
        "--no-prefilter", action="store_true", help="model-check even mutants that change no step"
    )
    spec.add_argument(
        "--no-coverage", action="store_true", help="skip the vacuity check (every action fires)"
    )


def _err(msg: str) -> int:
    raise UsageError(msg)  # main prints it, with {"error"} under --json, and exits 2


def _build(args: argparse.Namespace) -> Target:
    module = importlib.import_module(TARGETS[args.target])
    opts: dict[str, Any] = {"unit": not args.no_unit, "timeout_s": args.timeout}
    if args.examples is not None:
        opts["examples"] = args.examples
    t: Target = module.target(**opts)
    return t


def run(args: argparse.Namespace) -> int:
    if args.target not in TARGETS:
        return _err(f"unknown target {args.target!r}; valid targets: {', '.join(TARGETS)}")
    if args.sample is not None and args.sample < 1:
        return _err("--sample must be at least 1")
    if not 1 <= args.jobs <= MAX_JOBS:
        return _err(f"--jobs must be between 1 and {MAX_JOBS}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        return _err("--timeout must be a finite number of seconds > 0")
    if args.examples is not None and args.examples < 1:
        return _err("--examples must be at least 1")
    if not 0 <= args.min_kill <= 1:
        return _err("--min-kill must be between 0 and 1")
    if args.target == "spec":
        return _run_spec(args)
    target = _build(args)
    mutants = target.mutants()
    picked = sample(mutants, args.sample, args.seed) if args.sample else mutants
    if args.list:
        for m in picked:
            print(f"{m.id}  {m.file}:{m.line}  {m.description}")
        return 0
    equivalents = target.load_equivalents()
    picked, uncovered = _covered(args, picked)
    judge = " then ".join(c.name for c in target.checks) + ", to the first kill"
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with _Tally(len(picked), len(mutants), args.jobs, judge, target.checks) as tally:
        results = run_mutants(
            target.root,
            picked,
            target.checks,
            copy=target.copy,
            jobs=args.jobs,
            stop_at_first_kill=True,
            on_result=tally.add,
        )
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    report = summarise(results, equivalents, target.checks)
    report = {"target": target.name, "generated": len(mutants), **report}
    # mutants on lines no check executes: not run, counted as survivors in the rate
    not_covered = [m.to_json() for m in uncovered if m.id not in equivalents]
    killed = int(report["killed"])  # type: ignore[call-overload]
    judged = killed + len(report["survivors"]) + len(not_covered)  # type: ignore[arg-type]
    report["not_covered"] = not_covered
    report["kill_rate"] = round(killed / judged, 4) if judged else None
    report["cpu_seconds_per_mutant"] = round(cpu / len(results), 2) if results else None
    report["results"] = [  # per mutant: each check's outcome and its last output line
        {"id": r.mutant.id, **{k: [v, r.details.get(k, "")] for k, v in r.outcomes.items()}}
        for r in results
    ]
    rate = report["kill_rate"]
    ok = rate is None or rate >= args.min_kill
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report, results)
    return 0 if ok else 1


def _covered(args: argparse.Namespace, picked: list[Any]) -> tuple[list[Any], list[Any]]:
    """(mutants on lines the checks execute, the others), from the target's line tracer
    (``lines_argv``; run once on the unmutated code). Targets without one: all run."""
    lines_argv = getattr(importlib.import_module(TARGETS[args.target]), "lines_argv", None)
    if lines_argv is None or not picked or not args.skip_uncovered:
        return picked, []
    print("kvown mutate: tracing the lines the checks execute ...", file=sys.stderr, flush=True)
    argv = lines_argv(args.examples) if args.examples is not None else lines_argv()
    proc = children.popen(argv, stdout=subprocess.PIPE)
    try:
        raw, _ = proc.communicate()
    finally:
        children.release(proc)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    out = raw.decode()
    hit = {f: set(v) for f, v in json.loads(out.strip().splitlines()[-1]).items()}
    covered = [m for m in picked if m.line in hit.get(m.file, ())]
    uncovered = [m for m in picked if m.line not in hit.get(m.file, ())]
    print(
        f"kvown mutate: {len(uncovered)} of {len(picked)} mutants are on lines no check"
        " executes: reported as not covered, not run",
        file=sys.stderr,
        flush=True,
    )
    return covered, uncovered


class _Tally:
    """The plan before the run, the estimate after the first ``jobs`` mutants, a line per
    mutant, the progress (and Ctrl-C's tally so far): one place for both targets."""

    def __init__(
        self, n: int, generated: int, jobs: int, judge: str, checks: Sequence[Check] | None = None
    ) -> None:
        self.n, self.jobs, self.checks = n, min(jobs, max(1, n)), checks
        self.counts: dict[str, int] = {}
        self.seconds: list[float] = []  # each finished mutant's wall seconds
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.progress = Progress("mutate", n, "mutants", summary=self.summary)
        print(
            f"kvown mutate: plan: {n} of {generated} mutants, {self.jobs} at a time,"
            f" judged by {judge}; the time estimate follows the first {self.jobs}",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> _Tally:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def summary(self) -> str:
        with self.lock:
            return ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))

    def add(self, r: MutantResult) -> None:
        with self.lock:
            status = r.status(self.checks)
            self.counts[status] = self.counts.get(status, 0) + 1
            done = sum(self.counts.values())
        cols = " ".join(f"{k}={v}" for k, v in r.outcomes.items())
        print(f"{r.mutant.id}  {cols}  ({r.seconds:.0f} s)", file=sys.stderr, flush=True)
        with self.lock:
            self.seconds.append(r.seconds)
            each = sum(self.seconds) / len(self.seconds)  # measured: each mutant's own wall
        if done == self.jobs and self.n > done:
            left = each * (self.n - done) / self.jobs
            print(
                f"kvown mutate: estimate: {each:.0f} s per mutant (the first {done}, measured"
                f" on them alone), about {duration(left)} more for the other {self.n - done}",
                file=sys.stderr,
                flush=True,
            )
        self.progress.advance()

    def start_work(self) -> None:
        """The one-off start-up (the prefilter's exploration) is over: rates from now."""
        self.progress.start_work()


def _run_spec(args: argparse.Namespace) -> int:
    """``--target spec``: sampled spec mutants, each judged by the model check."""
    from model_checks.mutation import spec_target
    from model_checks.mutation.equivalents import EquivalentsError

    suites = tuple(args.suite or ["default"])
    pool = spec_target.mutants()
    n = len(args.only) if args.only else min(args.sample or SPEC_SAMPLE, len(pool))
    known = {m.id: m for m in pool}
    missing = [i for i in args.only if i not in known]
    if missing:  # before the plan: bad input is one error line
        return _err(f"unknown spec mutant ids: {', '.join(missing)}")
    if args.list:
        picked = [known[i] for i in args.only] or sample(pool, n, args.seed)
        for m in picked:
            print(f"{m.id}  {m.file}:{m.line}  {m.description}")
        return 0
    judge = f"the model check of {', '.join(suites)}"
    try:
        with _Tally(n, len(pool), args.jobs, judge) as tally:
            report, results = spec_target.run(
                suites,
                n=args.sample or SPEC_SAMPLE,
                seed=args.seed,
                jobs=args.jobs,
                timeout_s=args.timeout,
                only=args.only,
                prefilter=not args.no_prefilter,
                coverage=not args.no_coverage,
                on_result=tally.add,
                on_start=tally.start_work,
                skip_uncovered=args.skip_uncovered,
                say=lambda line: print(f"kvown mutate: {line}", file=sys.stderr, flush=True),
            )
    except (ValueError, EquivalentsError) as exc:
        return _err(str(exc))
    rate = report.get("kill_rate")
    ok = rate is None or float(rate) >= args.min_kill  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(report))
        return 0 if ok else 1
    print(
        f"{report['mutants']} mutants (of {report['generated']} generated) on"
        f" {', '.join(report['suites'])}: {report['killed']} killed,"  # type: ignore[arg-type]
        f" {len(report['survivors'])} survived, {report['timed_out']} timed out,"  # type: ignore[arg-type]
        f" {report['equivalent']} equivalent (reviewed); kill rate {rate}"
        f" ({report['not_covered']} survivors not covered, {report['unchanged']} change no step)"
    )
    for r in results:
        detail = next(iter(r.details.values()), "")
        print(f"  {r.status():8s} {r.mutant.id}  {r.mutant.description}  [{detail}]")
    for s in report["survivors"]:  # type: ignore[attr-defined]
        print(f"\nsurvivor {s['id']} ({s['file']}:{s['line']})\n{s['diff']}")
    return 0 if ok else 1


def _print(report: dict[str, Any], results: list[MutantResult]) -> None:
    from rich.table import Table

    from kvown_cli.progress import console

    con = console()
    rate = report["kill_rate"]
    con.print(
        f"[bold]{report['target']}[/]: {report['mutants']} of {report['generated']} mutants run; "
        f"killed {report['killed']}, survived {len(report['survivors'])}, "
        f"equivalent {report['equivalent']}, timed out {report['timed_out']}, "
        f"not covered {len(report.get('not_covered', []))}; "
        f"kill rate {'n/a' if rate is None else f'{rate:.1%}'}"
    )
    table = Table("check", "killed", "survived", "timeout")
    for name, col in report["by_check"].items():
        table.add_row(name, str(col["killed"]), str(col["survived"]), str(col["timeout"]))
    con.print(table)
    for s in report["survivors"]:
        con.print(f"\n[yellow]survived[/] {s['id']} ({s['file']}:{s['line']})")
        con.print(s["diff"], markup=False, highlight=False)
    for s in report.get("not_covered", []):
        con.print(f"[yellow]not covered[/] {s['id']} ({s['file']}:{s['line']})")
