"""``kvown mutate --target spec``: spec mutation testing.

Generates one-edit mutants of the spec's actions from their source (AST edits: drop a
conjunct, negate or flip a comparison, shift a constant, drop an update, swap two
effects...), judges each by the model check of the chosen suites in its own process,
and reports killed, survived and timed out, with the survivors' diffs. Equivalent
mutants are those on the reviewed list ``spec/equivalent_mutants.json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from model_checks.mutation import spec_target
from model_checks.mutation.equivalents import EquivalentsError
from model_checks.mutation.runner import MAX_JOBS
from spec.config import SUITES

HELP = "mutation testing: generated one-edit bugs of the spec, judged by the model check"
TARGETS = ("spec",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", choices=TARGETS, default="spec", help="what to mutate")
    p.add_argument(
        "--suite", choices=sorted(SUITES), action="append", help="suites that judge (default)"
    )
    p.add_argument("-n", type=int, default=120, help="mutants sampled (default 120)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--jobs", type=int, default=2, help="mutants judged at once")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant")
    p.add_argument("--only", metavar="ID", action="append", default=[], help="these mutant ids")
    p.add_argument(
        "--no-prefilter",
        action="store_true",
        help="model-check every mutant (skip the shortcut for mutants that change no step)",
    )
    p.add_argument(
        "--no-coverage",
        action="store_true",
        help="skip the vacuity check (a mutant that stops some action from ever firing)",
    )
    p.add_argument("--min-score", type=float, default=0.9, help="exit 1 below this kill rate")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _err(msg: str) -> int:
    print(f"kvown mutate: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.n < 1:
        return _err(f"-n must be at least 1, got {args.n}")
    if not 1 <= args.jobs <= MAX_JOBS:
        return _err(f"--jobs must be between 1 and {MAX_JOBS}, got {args.jobs}")
    if not args.timeout > 0:
        return _err(f"--timeout must be > 0, got {args.timeout}")
    if not 0 <= args.min_score <= 1:
        return _err(f"--min-score must be in 0..1, got {args.min_score}")
    try:
        report, results = spec_target.run(
            tuple(args.suite or ["default"]),
            n=args.n,
            seed=args.seed,
            jobs=args.jobs,
            timeout_s=args.timeout,
            only=args.only,
            prefilter=not args.no_prefilter,
            coverage=not args.no_coverage,
        )
    except (ValueError, EquivalentsError) as exc:
        return _err(str(exc))
    rate = report.get("kill_rate")
    ok = rate is None or float(rate) >= args.min_score  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(report))
        return 0 if ok else 1
    print(
        f"{report['mutants']} mutants (of {report['generated']} generated) on"
        f" {', '.join(report['suites'])}: {report['killed']} killed,"  # type: ignore[arg-type]
        f" {len(report['survivors'])} survived, {report['timed_out']} timed out,"  # type: ignore[arg-type]
        f" {report['equivalent']} equivalent (reviewed); kill rate {rate}"
    )
    for r in results:
        detail = next(iter(r.details.values()), "")
        print(f"  {r.status():8s} {r.mutant.id}  {r.mutant.description}  [{detail}]")
    for s in report["survivors"]:  # type: ignore[attr-defined]
        print(f"\nsurvivor {s['id']} ({s['file']}:{s['line']})\n{s['diff']}")
    return 0 if ok else 1
