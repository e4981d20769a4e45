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

A target names the files, the checks and the reviewed equivalents (``TARGETS``; see
``model_checks/mutation/target.py`` to add one). Each mutant runs in its own process on
a temporary copy of the repository, ``--jobs`` at a time.

Exit codes: 0 the kill rate (killed / (killed + survived), equivalents and timeouts
apart) is at least ``--min-kill``; 1 it is below; 2 misuse.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from typing import Any

from model_checks.mutation import MutantResult, Target, run_mutants, sample, summarise
from model_checks.mutation.runner import MAX_JOBS
from spec.config import SUITES

HELP = "one-edit mutants of the code, each judged by the checkers"
TARGETS: dict[str, str] = {  # target name -> module with ``target(**options) -> Target``
    "refimpl": "refimpl.testing.mutate",
    "spec": "kvown_cli.mutate_spec",  # judged by the model check: its own runner (run_spec)
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="refimpl", help=f"one of {', '.join(TARGETS)}")
    p.add_argument("--sample", type=int, metavar="N", help="run N mutants (default: all)")
    p.add_argument("--seed", type=int, default=0, help="which N (default 0)")
    p.add_argument("--jobs", type=int, default=2, help=f"parallel mutants, 1..{MAX_JOBS}")
    p.add_argument("--examples", type=int, metavar="N", help="fuzz examples per world")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per check")
    p.add_argument("--no-unit", action="store_true", help="skip the unit-test column")
    p.add_argument("--min-kill", type=float, default=0.9, help="exit 1 below this kill rate")
    p.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    spec = p.add_argument_group("--target spec")
    spec.add_argument("--suite", choices=sorted(SUITES), action="append", help="suites that judge")
    spec.add_argument("--only", metavar="ID", action="append", default=[], help="these mutant ids")
    spec.add_argument(
        "--no-prefilter", action="store_true", help="model-check even mutants that change no step"
    )
    spec.add_argument(
        "--no-coverage", action="store_true", help="skip the vacuity check (every action fires)"
    )


def _err(msg: str) -> int:
    print(f"error: kvown mutate: {msg}", file=sys.stderr)
    return 2


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
        from kvown_cli.mutate_spec import run_spec

        return run_spec(args)
    target = _build(args)
    mutants = target.mutants()
    picked = sample(mutants, args.sample, args.seed) if args.sample else mutants
    if args.list:
        for m in picked:
            print(f"{m.id}  {m.file}:{m.line}  {m.description}")
        return 0
    equivalents = target.load_equivalents()

    def progress(r: MutantResult) -> None:
        cols = " ".join(f"{k}={v}" for k, v in r.outcomes.items())
        print(f"{r.mutant.id}  {cols}  ({r.seconds:.0f} s)", file=sys.stderr, flush=True)

    results = run_mutants(
        target.root,
        picked,
        target.checks,
        copy=target.copy,
        jobs=args.jobs,
        on_result=progress,
    )
    report = summarise(results, equivalents, target.checks)
    report = {"target": target.name, "generated": len(mutants), **report}
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


def _print(report: dict[str, Any], results: list[MutantResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    rate = report["kill_rate"]
    con.print(
        f"[bold]{report['target']}[/]: {report['mutants']} of {report['generated']} mutants run; "
        f"killed {report['killed']}, survived {len(report['survivors'])}, "
        f"equivalent {report['equivalent']}, timed out {report['timed_out']}; "
        f"kill rate {'n/a' if rate is None else f'{rate:.1%}'}"
    )
    table = Table("check", "killed", "survived", "timeout")
    for name, col in report["by_check"].items():
        table.add_row(name, str(col["killed"]), str(col["survived"]), str(col["timeout"]))
    con.print(table)
    for s in report["survivors"]:
        con.print(f"\n[yellow]survived[/] {s['id']} ({s['file']}:{s['line']})")
        con.print(s["diff"], markup=False, highlight=False)
