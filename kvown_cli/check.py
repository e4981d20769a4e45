"""``kvown check``: the explicit-state model check (suite, one config, mutants).

Exit codes: 0 every property holds (every mutant caught), 1 a property is violated (a
mutant not caught), 2 misuse, 4 the state bound (``--max-states``) was reached: a verdict
on the states explored only ("bound reached, N states, properties held so far").
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from rich.table import Table

from kvown_cli import usage as outcome
from kvown_cli.junit import Case, write_junit
from kvown_cli.progress import Progress, console
from kvown_cli.usage import UsageError, int_in, output_path, refuse
from model_checks.explicit.explore import Progress as ProgressFn
from model_checks.explicit.graph import StateBound
from model_checks.explicit.runner import (
    MAX_STATES,
    ConfigResult,
    MutantResult,
    check_config,
    check_mutant,
    invariant_rows,
    property_rows,
)
from model_checks.explicit.trace import pretty, to_dot
from spec.config import SUITES, get_config
from spec.mutants import MUTANTS, get_mutant
from spec.strict_json import short

HELP = "explore the spec exhaustively (default suite)"
DOT_MAX_STATES = 5000  # to_dot's limit on a whole graph
EXIT_BOUND = 4  # the state bound reached: no verdict beyond the states explored


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--config", metavar="NAME", help="check one config")
    g.add_argument("--mutant", metavar="NAME", help="check a mutant where it must fail")
    g.add_argument("--all-mutants", action="store_true", help="the mutant matrix")
    g.add_argument(
        "--suite",
        choices=sorted(SUITES),
        help="a named suite: default (the small worlds) or deep (the larger ones, nightly)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="explore with N processes (a partitioned visited set, the same states, verdicts"
        " and counterexamples); 1: the serial explorer",
    )
    p.add_argument(
        "--max-states",
        type=int_in(1, 1_000_000_000),
        default=MAX_STATES,
        metavar="N",
        help="the state bound per config: reached, the check ends with exit 4 (bound"
        f" reached, N states, properties held so far) (default: {MAX_STATES})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dot", metavar="FILE", help="write the state graph (or cex) as DOT")
    p.add_argument(
        "--junit", metavar="FILE", help="write JUnit XML: a testcase per property x config"
    )
    p.add_argument(
        "--cex-dir",
        metavar="DIR",
        help="on a violation, write its counterexample there as JSON (kvown replay reads it)"
        " and DOT (--all-mutants: the JSON of every mutant); the folder is made when missing",
    )


def _make_dir(path: str) -> None:
    """The counterexample folder, made when missing (``--cex-dir cex`` in a fresh checkout)."""
    if not path or "\0" in path:
        raise UsageError("--cex-dir: empty or invalid path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--cex-dir: cannot make {short(path)}: {exc.strerror or exc}") from None


def _err(args: argparse.Namespace, msg: str) -> int:
    return refuse("check", msg, args.json)


def run(args: argparse.Namespace) -> int:
    try:
        output_path(args.dot, "--dot")
        output_path(args.junit, "--junit")
        if args.cex_dir is not None:
            _make_dir(args.cex_dir)
            output_path(os.path.join(args.cex_dir, "cex.json"), "--cex-dir")
    except UsageError as exc:
        return _err(args, str(exc))
    if not 1 <= args.workers <= 64:
        return _err(args, f"--workers {args.workers}: a number of processes from 1 to 64")
    try:
        if args.config is not None:
            get_config(args.config)
        if args.mutant is not None:
            get_mutant(args.mutant)
    except KeyError as exc:
        return _err(args, str(exc.args[0]))
    if args.dot and not (args.config or args.mutant):
        return _err(args, "--dot needs --config (a small config's graph) or --mutant (its cex)")
    if args.dot and args.config and _pinned_states(args.config) > DOT_MAX_STATES:
        n = _pinned_states(args.config)
        return _err(args, f"--dot: {args.config} has {n} states, DOT is for <= {DOT_MAX_STATES}")
    if args.all_mutants:
        return _all_mutants(args)
    if args.mutant is not None:
        return _mutant(args)
    names = (args.config,) if args.config else SUITES[args.suite or "default"]
    return _suite(args, names)


def _pinned_states(name: str) -> int:
    """The config's pinned state count (0 when not pinned: then the check decides)."""
    from model_checks.explicit.pin import PINNED

    pinned = json.loads(PINNED.read_text()).get("configs", {}).get(name, {})
    return int(pinned.get("distinct_states", 0))


def _suite(args: argparse.Namespace, names: tuple[str, ...]) -> int:
    results: list[ConfigResult] = []
    # The work left is measured in states when every config's count is pinned (sizes
    # differ by 1000x: a rate per config would be far off), else in configs.
    sizes = {n: _pinned_states(n) for n in names}
    by_states = len(names) > 1 and all(sizes.values())
    total = sum(sizes.values()) if by_states else len(names)
    base = 0
    with Progress("check", total, "states" if by_states else "configs") as bar:
        for k, name in enumerate(names):
            bar.update(note=f"config {k + 1}/{len(names)}: exploring {name}")

            def tick(n: int, frontier: int, name: str = name, k: int = k, at: int = base) -> None:
                done = at + min(n, sizes[name]) if by_states else None
                note = f"config {k + 1}/{len(names)}: exploring {name}: {n:,} states"
                bar.update(done, note=note)

            fn: ProgressFn = tick
            try:
                res = check_config(
                    name, progress=fn, workers=args.workers, max_states=args.max_states
                )
            except StateBound as exc:
                return _bound(args, exc, results)
            results.append(res)
            base += sizes[name]
            bar.update(base) if by_states else bar.advance()
    rows = property_rows(results)
    inv_rows = invariant_rows(results)  # INVARIANTS.md's conjuncts, evaluated on every state
    violated = next((r for r in (*rows, *inv_rows) if not r["holds"]), None)
    if args.dot:
        g = results[0].graph
        try:
            text = to_dot(g)
        except ValueError as exc:
            return _err(args, str(exc))
        outcome.write_text(args.dot, text)
    first = None
    if violated is not None:
        pid = str(violated["id"])
        first = next(r.violations[pid] for r in results if pid in r.violations)
    if args.junit:
        write_junit(args.junit, "kvown check", _suite_cases(results))
    if args.cex_dir and first is not None:
        g = next(r.graph for r in results if r.name == first.config)
        _write_cex(args.cex_dir, first.config, first.prop, first.steps, to_dot(g, path=first.steps))
    if args.json:
        out: dict[str, Any] = {
            "configs": [r.summary() for r in results],
            "properties": [{"id": r["id"], "kind": r["kind"], "holds": r["holds"]} for r in rows],
            "invariants": [
                {"id": r["id"], "holds": r["holds"], "configs": r["configs"]} for r in inv_rows
            ],
        }
        if first is not None:
            out.update(violated=first.prop, config=first.config, trace=first.steps)
        print(json.dumps(out))
        return 1 if first is not None else 0
    con = console()
    ct = Table(title="configs")
    for col in ("config", "distinct states", "edges", "depth", "seconds", "states/s"):
        ct.add_column(col, justify="right" if col != "config" else "left")
    for r in results:
        rate = r.graph.n_states / r.graph.seconds if r.graph.seconds else 0.0
        ct.add_row(
            r.name,
            f"{r.graph.n_states:,}",
            f"{r.graph.n_edges:,}",
            str(r.graph.max_depth),
            f"{r.seconds:.2f}",
            f"{rate:,.0f}",
        )
    con.print(ct)
    pt = Table(title="properties")
    for col in ("property", "kind", "verdict", "configs", "states", "seconds"):
        pt.add_column(col)
    for row in (*rows, *inv_rows):
        verdict = "holds" if row["holds"] else f"VIOLATED in {', '.join(row['violated_in'])}"  # type: ignore[arg-type]
        pt.add_row(
            str(row["id"]),
            str(row["kind"]),
            verdict,
            str(row["configs"]),
            f"{row['states']:,}",
            f"{row['seconds']:.2f}",
        )
    con.print(pt)
    if first is not None:
        c = get_config(first.config)
        con.print(pretty(c, frozenset(), first.steps, first.prop), markup=False, highlight=False)
        return 1
    return 0


def _bound(args: argparse.Namespace, exc: StateBound, results: list[ConfigResult]) -> int:
    """The state bound reached: what was checked, as a verdict of its own (exit 4)."""
    done = [r.name for r in results]
    if args.json:
        out = {
            "bound_reached": {"config": exc.config, "states": exc.bound, "violated": exc.violated},
            "configs_done": done,
        }
        print(json.dumps(out))
    else:
        print(f"bound reached: {exc}")
        if done:
            print(f"configs checked in full before it: {', '.join(done)}")
    return 1 if exc.violated else EXIT_BOUND


def _suite_cases(results: list[ConfigResult]) -> list[Case]:
    """One testcase per property x config (and per INVARIANTS.md conjunct claimed in the
    config); a failure carries the pretty counterexample.

    The properties of a config are checked together, in one exploration: each testcase
    gets an equal share of its config's time, so the suite's time is the run's."""
    from spec.invariants import for_config
    from spec.properties import LIVENESS, SAFETY

    cases = []
    for r in results:
        c = get_config(r.name)
        ids = [p.id for p in (*SAFETY, *LIVENESS)] + [n for n, _ in for_config(c)]
        share = r.seconds / len(ids)
        for pid in ids:
            v = r.violations.get(pid)
            text = None if v is None else pretty(c, frozenset(), v.steps, pid)
            msg = f"{pid} violated on {r.name}" if v is not None else ""
            cases.append(Case(f"kvown.check.{r.name}", pid, share, text, msg))
    return cases


def _mutant_case(r: MutantResult) -> Case:
    """A mutant's testcase passes when the model check catches it (the matrix's sense)."""
    if r.caught:
        return Case("kvown.check.mutants", r.name, r.seconds)
    msg = f"{r.name}: {r.expected} holds on {r.config}"
    return Case("kvown.check.mutants", r.name, r.seconds, f"NOT CAUGHT: {msg}", msg)


def _write_cex(
    folder: str, config: str, prop: str, steps: list[Any], dot: str, mutant: str | None = None
) -> None:
    """``<config>[.<mutant>].<property>.json`` (the replayable trace) and ``.dot``."""
    stem = os.path.join(folder, ".".join(x for x in (config, mutant, prop) if x))
    _write_cex_json(f"{stem}.json", config, mutant, prop, steps)
    outcome.write_text(f"{stem}.dot", dot)


def _write_cex_json(path: str, config: str, mutant: str | None, prop: str, steps: Any) -> None:
    out = {"config": config, "mutants": [mutant] if mutant else [], "violated": prop}
    outcome.write_text(path, json.dumps({**out, "trace": steps}, indent=1))


def _mutant(args: argparse.Namespace) -> int:
    r = check_mutant(args.mutant, args.workers)
    if args.cex_dir and r.trace is not None:
        from model_checks.explicit.explore import explore

        g = explore(get_config(r.config), frozenset({r.name}), stop_on=r.expected)
        dot = to_dot(g, path=r.trace.steps)
        _write_cex(args.cex_dir, r.config, r.expected, r.trace.steps, dot, mutant=r.name)
    if args.junit:  # the counterexample is the finding: exit 1, a failing testcase
        c = get_config(r.config)
        text = f"violated: {', '.join(r.violated)}"
        if r.trace is not None:
            text = pretty(c, frozenset({r.name}), r.trace.steps, r.expected)
        msg = f"{', '.join(r.violated)} violated on {r.config} by {r.name}"
        case = Case("kvown.check.mutant", r.name, r.seconds, text if r.violated else None, msg)
        write_junit(args.junit, "kvown check", [case])
    if args.dot and r.trace is not None:
        from model_checks.explicit.explore import explore

        g = explore(get_config(r.config), frozenset({r.name}), stop_on=r.expected)
        outcome.write_text(args.dot, to_dot(g, path=r.trace.steps))
    if args.json:
        out: dict[str, Any] = {
            "mutant": r.name,
            "expected": r.expected,
            "config": r.config,
            "violated": r.expected if r.caught else (r.violated[0] if r.violated else None),
            "violated_all": r.violated,
            "trace": r.trace.steps if r.trace is not None else [],
            "trace_length": r.trace_length,
            "incident": MUTANTS[r.name].seed_failure,
        }
        print(json.dumps(out))
        return 1 if r.violated else 0
    con = console()
    con.print(f"mutant {r.name}: {MUTANTS[r.name].doc}", markup=False)
    con.print(f"the failure it is: {MUTANTS[r.name].seed_failure}", markup=False)
    if r.trace is None:
        con.print(f"NOT CAUGHT: {r.expected} holds on {r.config}", markup=False)
        return 0
    c = get_config(r.config)
    con.print(pretty(c, frozenset({r.name}), r.trace.steps, r.expected), markup=False)
    return 1


def _all_mutants(args: argparse.Namespace) -> int:
    results: list[MutantResult] = []
    with Progress("check", len(MUTANTS), "mutants") as bar:
        for name in MUTANTS:
            bar.update(note=f"mutant {name}")
            results.append(check_mutant(name, args.workers))
            bar.advance()
    ok = all(r.caught for r in results)
    if args.cex_dir:  # the replayable JSON of each (a DOT drawing: --mutant NAME)
        for r in results:
            if r.trace is not None:
                path = os.path.join(args.cex_dir, f"{r.config}.{r.name}.{r.expected}.json")
                _write_cex_json(path, r.config, r.name, r.expected, r.trace.steps)
    if args.junit:
        write_junit(args.junit, "kvown check --all-mutants", [_mutant_case(r) for r in results])
    if args.json:
        print(
            json.dumps(
                {
                    "mutants": [
                        {
                            "name": r.name,
                            "expected": r.expected,
                            "violated": r.expected if r.caught else None,
                            "trace_length": r.trace_length,
                            "config": r.config,
                        }
                        for r in results
                    ],
                    "all_caught": ok,
                }
            )
        )
        return 0 if ok else 1
    t = Table(title="mutants")
    for col in ("mutant", "expected", "violated", "trace length", "config", "seconds"):
        t.add_column(col)
    for r in results:
        t.add_row(
            r.name,
            r.expected,
            r.expected if r.caught else "[red]not caught[/red]",
            str(r.trace_length if r.trace_length is not None else "-"),
            r.config,
            f"{r.seconds:.2f}",
        )
    console().print(t)
    return 0 if ok else 1
