"""``kvown prove``: the z3 claims (BMC of every safety mutant and of the correct spec,
inductive invariants for any number of requests, layout bijections).

Exit codes: 0 when every claim has its expected result (every property proved, every
safety mutant violated at its BFS depth, every layout claim as expected), 1 when one
does not, 2 on misuse.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvown_cli.junit import Case, write_junit
from kvown_cli.progress import Progress, console
from kvown_cli.usage import MAX_JOBS, UsageError, int_in, output_path, refuse

HELP = "z3: BMC of mutants, inductive invariants, layouts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--mutant", metavar="NAME", help="show one safety mutant's BMC counterexample")
    p.add_argument("--property", metavar="ID", help="prove one safety property by induction")
    p.add_argument(
        "--drop",
        metavar="CONJ",
        action="append",
        default=[],
        help="with --property: leave a conjunct out of its invariant (shows the CTI)",
    )
    p.add_argument(
        "--only",
        choices=("induction", "bmc", "layout"),
        action="append",
        help="run only these claim groups (repeatable)",
    )
    p.add_argument("--quick", action="store_true", help="the small layout grid")
    p.add_argument("--all", action="store_true", help="list every layout claim (not grouped)")
    p.add_argument(
        "--jobs",
        type=int_in(1, MAX_JOBS),
        default=min(2, os.cpu_count() or 1),
        help=f"worker processes, 1..{MAX_JOBS} (default: 2 or the CPU count)",
    )
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML: one testcase per claim")


def _console() -> Console:
    """No emoji codes (``layout:bug:...`` is an id), and room for the ids in a pipe."""
    return console()


def run(args: argparse.Namespace) -> int:
    def _err(msg: str) -> int:
        return refuse("prove", msg, args.json)

    try:
        output_path(args.junit, "--junit")
    except UsageError as exc:
        return _err(str(exc))
    if not 1 <= args.jobs <= MAX_JOBS:
        return _err(f"--jobs must be in [1, {MAX_JOBS}], got {args.jobs}")
    if args.junit and (args.mutant is not None or args.property is not None):
        return _err("--junit goes with the claims run (no --mutant, no --property)")
    import z3

    # Ctrl-C is kvown's: z3's own SIGINT handler, installed during each check, would
    # take the signal, cancel that one check as "unknown" and let the run go on.
    z3.set_param("ctrl_c", False)
    if args.mutant is not None:
        return _mutant(args, _err)
    if args.property is not None:
        return _property(args, _err)
    if args.drop:
        return _err("--drop needs --property")
    return _claims(args)


def _claims(args: argparse.Namespace) -> int:
    from model_checks.symbolic.claims import GROUPS, Claim, run_all, tasks

    t0 = time.perf_counter()
    groups = tuple(args.only or GROUPS)
    n_tasks = len(tasks(groups, args.quick))  # the z3 tasks; a task gives one claim or more
    with Progress("prove", n_tasks, "z3 tasks") as bar:

        def tick(got: list[Claim]) -> None:
            bar.advance(note=f"last: {got[0].id}" if got else None)

        claims = run_all(groups, args.quick, max(1, args.jobs), tick)
    wall = time.perf_counter() - t0
    ok = all(c.ok for c in claims)
    if args.junit:
        write_junit(args.junit, "kvown prove", [_claim_case(c) for c in claims])
    if args.json:
        keys = ("id", "method", "result", "seconds", "expected", "ok", "detail")
        out = [{k: c.public()[k] for k in keys} for c in claims]
        print(json.dumps({"claims": out, "ok": ok, "wall_seconds": round(wall, 3)}))
        return 0 if ok else 1
    con = _console()
    title = f"kvown prove: {len(claims)} claims (from {n_tasks} z3 tasks) in {wall:.1f}s wall"
    table = Table(title=title)
    for col in ("claim", "method", "verdict", "seconds", "detail"):
        just: Any = "right" if col == "seconds" else "left"
        table.add_column(col, justify=just, no_wrap=col != "detail", overflow="fold")
    for row in _rows(claims, args.all):
        table.add_row(*(Text(cell) for cell in row))
    con.print(table)
    from model_checks.symbolic.bmc import LIVENESS_MUTANTS

    if "bmc" in (args.only or GROUPS):
        con.print(
            f"not BMC claims: {', '.join(LIVENESS_MUTANTS)} (they break liveness properties:"
            " lassos, checked on the state graph by `kvown check`)",
            markup=False,
        )
    for c in claims:
        if c.cti:
            print(f"\ncounterexample to induction for {c.id}:")
            print("\n".join(c.cti))
    if not ok:
        bad = [c.id for c in claims if not c.ok]
        con.print(f"FAILED: {', '.join(bad[:10])}", markup=False)
    return 0 if ok else 1


def _verdict(c: Any) -> str:
    v = str(c.result)
    return v if c.ok else f"{v} (expected {c.expected})"


def _short(detail: str, n: int = 70) -> str:
    return detail if len(detail) <= n else detail[: n - 3] + "..."


def _rows(claims: list[Any], every: bool) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    layout: dict[str, list[Any]] = defaultdict(list)
    for c in claims:
        if c.id.startswith("layout:") and not every and c.ok:
            parts = c.id.split(":")
            layout[":".join(parts[:2]) if len(parts) > 2 else c.id].append(c)
            continue
        rows.append((c.id, c.method, _verdict(c), f"{c.seconds:.2f}", _short(c.detail)))
    for group, cs in layout.items():
        if len(cs) == 1:
            c = cs[0]
            rows.append((c.id, c.method, _verdict(c), f"{c.seconds:.2f}", _short(c.detail)))
            continue
        secs = sum(c.seconds for c in cs)
        results = sorted({c.result for c in cs})
        detail = f"{len(cs)} instances (--all lists them)"
        rows.append((f"{group}:*", cs[0].method, "/".join(results), f"{secs:.2f}", detail))
    return rows


def _mutant(args: argparse.Namespace, _err: Callable[[str], int]) -> int:
    from model_checks.explicit.trace import pretty
    from model_checks.symbolic.bmc import (
        SAFETY_MUTANTS,
        bfs_depth,
        mutant_bmc,
    )
    from spec.config import get_config
    from spec.mutants import MUTANTS
    from spec.properties import PROPERTIES

    name = args.mutant
    if name not in MUTANTS:
        return _err(f"unknown mutant {name!r}; valid mutants: {', '.join(MUTANTS)}")
    if name not in SAFETY_MUTANTS:
        prop = MUTANTS[name].expected
        kind = PROPERTIES[prop].kind if prop in PROPERTIES else "safety"  # INVARIANTS.md
        why = f"a {kind} property"
        return _err(
            f"mutant {name!r} breaks {prop}, {why}: not a BMC claim"
            f" (see `kvown check --mutant {name}`); BMC mutants: {', '.join(SAFETY_MUTANTS)}"
        )
    res = mutant_bmc(name)
    want = bfs_depth(name)
    ok = res.depth is not None and res.depth == want
    if args.json:
        out: dict[str, Any] = {**res.trace_json(), "depth": res.depth, "bfs_depth": want}
        out["seconds"] = round(res.seconds, 3)
        print(json.dumps(out))
        return 0 if ok else 1
    con = _console()
    con.print(f"mutant {name}: {MUTANTS[name].doc}", markup=False)
    if res.depth is None:
        con.print(f"no violation of {res.props[0]} up to depth {res.bound}", markup=False)
        return 1
    con.print(
        f"z3 BMC: {res.violated[0]} violated at depth {res.depth} (BFS shortest: {want});"
        f" {res.seconds:.2f}s; the trace replays on the explicit spec",
        markup=False,
    )
    c = get_config(res.config)
    con.print(pretty(c, frozenset({name}), res.steps, res.violated[0]), markup=False)
    return 0 if ok else 1


def _property(args: argparse.Namespace, _err: Callable[[str], int]) -> int:
    from model_checks.symbolic.claims import TPS, induction_claims, merge_tps
    from model_checks.symbolic.invariants import STRENGTHENING, SUPPORT

    pid = args.property
    if pid not in SUPPORT:
        return _err(f"unknown safety property {pid!r}; valid: {', '.join(SUPPORT)}")
    known = set(STRENGTHENING) | set(SUPPORT)
    bad = [d for d in args.drop if d not in known]
    if bad:
        return _err(f"unknown conjunct {bad[0]!r}; valid: {', '.join(sorted(known))}")
    claims = merge_tps([c for tp in TPS for c in induction_claims(tp, (pid,), tuple(args.drop))])
    c = claims[0]
    if args.json:
        keys = ("id", "method", "result", "seconds", "expected", "ok", "detail", "cti")
        print(json.dumps({"claims": [{k: c.public()[k] for k in keys}]}))
        return 0 if c.ok else 1
    con = _console()
    names = [n for n in (pid, *SUPPORT[pid]) if n not in args.drop]
    conj = " and ".join(names)
    con.print(f"{pid}: invariant = {conj}", markup=False)
    con.print(f"{c.method}: {c.result} in {c.seconds:.2f}s ({c.detail})", markup=False)
    if c.cti:
        print("counterexample to induction:")
        print("\n".join(c.cti))
    return 0 if c.ok else 1


def _claim_case(c: Any) -> Case:
    """One testcase per claim; a failure carries the verdict, detail and any CTI."""
    if c.ok:
        return Case(f"kvown.prove.{c.method}", c.id, c.seconds)
    text = "\n".join([f"{c.id}: {_verdict(c)}", c.detail, *c.cti])
    return Case(f"kvown.prove.{c.method}", c.id, c.seconds, text, f"{c.id}: {_verdict(c)}")
