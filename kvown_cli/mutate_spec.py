"""``kvown mutate --target spec``: spec mutation testing (``kvown_cli.mutate`` parses).

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

SPEC_SAMPLE = 120  # mutants sampled when --sample is not given


def _err(msg: str) -> int:
    print(f"error: kvown mutate: {msg}", file=sys.stderr)
    return 2


def run_spec(args: argparse.Namespace) -> int:
    """``kvown mutate --target spec`` (options already validated by ``kvown_cli.mutate``)."""
    try:
        report, results = spec_target.run(
            tuple(args.suite or ["default"]),
            n=args.sample or SPEC_SAMPLE,
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
    ok = rate is None or float(rate) >= args.min_kill  # type: ignore[arg-type]
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
