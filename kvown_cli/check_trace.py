"""``kvown check-trace FILE``: replay an engine's JSONL event log against the spec.

Exit 0: the log conforms. 1: a violation (the first event not allowed or breaking a
property, with its line, the property ID and the state before it). 2: malformed input
(bad JSON, unknown action or config, missing or ill-typed argument, empty log), with a
line-numbered message. The format is in spec/EVENTLOG.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvown_cli.junit import Case, write_junit
from kvown_cli.usage import MAX_GAP, UsageError, one_line, output_path
from model_checks.conformance import ASSUMABLE, DEFAULT_MAX_GAP, LogError, Verdict, check_file
from spec.actions import ACTIONS

HELP = "check an engine's JSONL event log against the spec (0 conforms, 1 violation, 2 malformed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the event log (JSONL; see spec/EVENTLOG.md)")
    p.add_argument("--config", help="spec config (default: the 'config' of the log's header)")
    p.add_argument(
        "--max-gap",
        type=int,
        default=DEFAULT_MAX_GAP,
        metavar="K",
        help=f"unlogged steps the checker may assume before one event (default {DEFAULT_MAX_GAP})",
    )
    p.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="ACTION",
        help="also let ACTION be assumed when unlogged (repeatable)",
    )
    p.add_argument(
        "--open",
        action="store_true",
        help="the log was cut from a running engine: skip the end-of-log stall checks",
    )
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML: one testcase for the log")


def format_verdict(v: Verdict) -> str:
    """The human-readable verdict: what, where, why, the state before, what was assumed."""
    head = f"config {v.config}, {v.events} events, {len(v.assumed)} assumed steps"
    lines = [("CONFORMS: " if v.conforms else "VIOLATION: ") + head]
    if v.timeout_s is not None:
        named = ", ".join(f"{k} ({w})" for k, w in v.clocks.items())
        lines.append(
            f"  time: timeout_s={v.timeout_s:g}, clock_skew_s={v.clock_skew_s:g}"
            + (f", process clocks {named}" if named else "")
        )
    if not v.conforms:
        lines.append(f"  line {v.line}: {json.dumps(v.event)}")
        lines.append(f"  property: {', '.join(v.properties) or v.violated}")
        lines.append(f"  why: {v.reason}")
        lines.append(f"  state before: {v.state}")
        if v.refuted_by is not None:
            lines.append(f"  refuted by line {v.refuted_by}; the explanation tried:")
    for s in v.assumed:
        args = ", ".join(f"{k}={val}" for k, val in s["args"].items())
        lines.append(f"  assumed before line {s['before_line']}: {s['action']}({args})")
    return "\n".join(lines)


def _malformed(args: argparse.Namespace, msg: str, line: int | None) -> int:
    where = f"{args.file}:{line}: " if line is not None else f"{args.file}: "
    msg = one_line(msg)
    print(one_line(f"error: {where}{msg}"), file=sys.stderr)
    if args.json:
        out = {"conforms": False, "violated": None, "line": line, "event": None}
        print(json.dumps({**out, "assumed_steps": [], "error": msg}))
    return 2


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.max_gap <= MAX_GAP:
        return _malformed(args, f"--max-gap must be in [0, {MAX_GAP}], got {args.max_gap}", None)
    try:
        output_path(args.junit, "--junit")
    except UsageError as exc:
        return _malformed(args, str(exc), None)
    unknown = [a for a in args.assume if a not in ACTIONS]
    if unknown:
        return _malformed(args, f"--assume: unknown action(s) {unknown}", None)
    try:
        verdict = check_file(
            args.file,
            args.config,
            max_gap=args.max_gap,
            assumable=ASSUMABLE | frozenset(args.assume),
            open_end=args.open,
        )
    except LogError as exc:
        from kvown_cli.replay import cex_hint  # a saved counterexample is not an event log

        return _malformed(args, exc.msg + cex_hint(args.file, exc.head), exc.line)
    if args.junit:
        text = None if verdict.conforms else format_verdict(verdict)
        msg = f"line {verdict.line}: {verdict.violated}"
        case = Case("kvown.check-trace", args.file, 0.0, text, msg)
        write_junit(args.junit, "kvown check-trace", [case])
    if args.json:
        print(json.dumps(verdict.to_json()))
    else:
        print(format_verdict(verdict))
    return 0 if verdict.conforms else 1
