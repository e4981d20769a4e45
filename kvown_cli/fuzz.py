"""``kvown fuzz``: the Hypothesis machine on the torch reference engine.

    kvown fuzz                         the correct engine, every world (the default configs
                                       and the combined ones), ci budget
    kvown fuzz --config NAME --seconds 60 --profile nightly
    kvown fuzz --all-mutants [--json]  the kill matrix: every bug switch must be caught
    kvown fuzz --mutant NAME           one switch (judged by the graph tour first, then
                                       the machine)
    kvown fuzz --tour [--config NAME]  the graph tour (``refimpl.testing.tour``): every
                                       edge of handoff_crash, offload_contend and
                                       offload_crash, every reachable (action, outcome)
                                       pair of every default config, replayed with every
                                       check; the coverage report (--json too)

Exit codes: 0 nothing found (fuzzing; the tour: and every edge or pair covered) or every
applicable switch killed (matrix); 1 a divergence (its shrunk program is printed), a
surviving switch, or a tour that left part of its goal uncovered; 2 misuse.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from kvown_cli.junit import Case, write_junit
from kvown_cli.progress import Progress, console
from kvown_cli.reports.budget import hard_deadline
from kvown_cli.usage import (
    MAX_EXAMPLES,
    MAX_SECONDS,
    UsageError,
    int_in,
    output_path,
    positive_seconds,
    refuse,
    since_start,
    started,
)
from refimpl.testing import EngineAdapter
from refimpl.testing.harness import NONTRIVIAL, Coverage
from refimpl.testing.run import (
    PROFILES,
    BudgetSpent,
    Deadline,
    Kill,
    RunResult,
    hunt,
    kill,
    shrunk,
    state_share,
)
from refimpl.testing.worlds import FUZZ_WORLDS
from refimpl.testing.worlds import get_world as get_config
from spec.actions import ACTIONS
from spec.properties import SAFETY

HELP = "fuzz the reference implementation against the spec (Hypothesis)"
SMALL = 10_000  # configs with at most this many states get their share by default


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--all-mutants", action="store_true", help="the kill matrix of every switch")
    g.add_argument("--mutant", metavar="NAME", action="append", help="hunt one switch")
    g.add_argument("--tour", action="store_true", help="the graph tour and its coverage report")
    p.add_argument("--config", metavar="NAME", help="fuzz one config (default: the suite)")
    p.add_argument("--impl", choices=("engine", "api"), default="engine", help="--tour on it")
    p.add_argument(
        "--across-processes",
        action="store_true",
        help="with --tour --impl api: the Receiver in its own OS process, over DistTransport",
    )
    p.add_argument(
        "--examples",
        type=int_in(1, MAX_EXAMPLES),
        metavar="N",
        help="examples per config or switch (default: the profile's, ci: 100 per config,"
        " 500 per switch)",
    )
    p.add_argument(
        "--seconds",
        type=positive_seconds,
        metavar="S",
        help="a hard time budget, finite and > 0: in all when fuzzing or touring, per switch"
        " with --mutant/--all-mutants, counted from the command's start (imports included);"
        " what was done when it runs out is reported (default: none, the examples bound the"
        " work)",
    )
    p.add_argument("--profile", default="ci", help=f"one of {', '.join(PROFILES)} (default ci)")
    p.add_argument(
        "--coverage",
        action="store_true",
        help="state share, graph edges and (action, outcome) pairs taken, on every config",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML: a testcase per config/mutant")


def run(args: argparse.Namespace) -> int:
    def _err(msg: str) -> int:
        return refuse("fuzz", msg, args.json)

    try:
        output_path(args.junit, "--junit")
    except UsageError as exc:
        return _err(str(exc))
    sec = args.seconds
    if sec is not None and not (math.isfinite(sec) and 0 < sec <= MAX_SECONDS):
        return _err(f"--seconds must be finite, in (0, {MAX_SECONDS}], got {sec}")
    adapter = EngineAdapter()
    switches = adapter.switches()
    if args.profile not in PROFILES:
        return _err(f"unknown profile {args.profile!r}; valid profiles: {', '.join(PROFILES)}")
    for name in args.mutant or ():
        if name not in switches:
            return _err(f"unknown mutant {name!r}; valid mutants: {', '.join(switches)}")
    if args.config is not None:
        if args.all_mutants or args.mutant:
            return _err(
                "--config is for fuzzing the correct engine; a switch is hunted on its config"
            )
        try:
            get_config(args.config)
        except KeyError as exc:
            return _err(str(exc.args[0]))
    if args.examples is not None and not 1 <= args.examples <= MAX_EXAMPLES:
        return _err(f"--examples must be in [1, {MAX_EXAMPLES}]")
    if args.all_mutants or args.mutant:
        return _matrix(args, adapter, list(switches) if args.all_mutants else args.mutant)
    if args.across_processes and args.impl != "api":
        return _err("--across-processes is for --tour --impl api")
    if args.impl == "api":  # the tour on the public API (``refimpl.testing.on_api.report``)
        from refimpl.testing.on_api.report import tour_api

        deadline = Deadline(args.seconds, since=started())  # from the command's start
        return tour_api(args, _err, lambda: hard_deadline(deadline))
    if args.tour:
        from kvown_cli.reports.fuzz_tour import tour

        return tour(args, adapter)
    return _fuzz(args, adapter)


# --------------------------------------------------------------------- fuzzing
def _fuzz(args: argparse.Namespace, adapter: EngineAdapter) -> int:
    names = (args.config,) if args.config else FUZZ_WORLDS
    # The budget counts from the command's start (imports included); each config gets an
    # equal share of what is left when it starts.
    budget = Deadline(args.seconds, since=started())
    startup_s = since_start()
    total = Coverage()
    results: list[RunResult] = []
    shares: dict[str, tuple[int, int]] = {}
    graph: dict[str, dict[str, Any]] = {}
    err = Console(stderr=True)
    with Progress("fuzz", len(names), "configs") as bar:
        for i, name in enumerate(names):
            cov = Coverage(states=set(), edges=set())
            bar.update(note=f"fuzzing {name}")
            if not args.json:
                err.print(f"fuzzing {name} ...", highlight=False)
            left = budget.left()
            res = hunt(
                adapter,
                name,
                profile=args.profile,
                examples=args.examples,
                deadline=Deadline(None if left is None else left / (len(names) - i)),
                coverage=cov,
            )
            results.append(res)
            total.merge(cov)
            bar.advance()
            if res.failed:
                break
            try:  # the share and the graph explore the config: within the budget too
                with hard_deadline(budget):
                    if args.coverage or _small(name):
                        assert cov.states is not None
                        shares[name] = state_share(cov.states, get_config(name))
                    if args.coverage:  # the graph's edges and (action, outcome) pairs it took
                        from refimpl.testing.tour import plan_tour, report

                        graph[name] = report(plan_tour(get_config(name), "pairs"), cov)
            except BudgetSpent:
                pass  # out of time: reported without them
    failed = next((r for r in results if r.failed), None)
    detail = _failure_text(adapter, failed) if failed is not None else None
    if args.junit:
        cases = [
            Case(
                "kvown.fuzz.configs",
                r.config,
                r.seconds,
                detail if r is failed else None,
                f"the engine diverges from the spec on {r.config}",
            )
            for r in results
        ]
        write_junit(args.junit, "kvown fuzz", cases)
    spent = {
        "seconds": args.seconds,  # the budget, from the command's start
        "startup_s": round(startup_s, 2),  # start-up and imports, before the first hunt
        "elapsed_s": round(since_start(), 2),  # the whole command, to its report
        "out_of_time": any(r.out_of_time for r in results) or budget.passed(),
    }
    if args.json:
        out = _fuzz_json(results, total, shares, detail)
        out["coverage"]["graph"] = graph
        out["budget"] = spent
        print(json.dumps(out))
    else:
        _print_fuzz(results, total, shares, detail)
        if args.seconds is not None:
            print(
                f"budget {args.seconds:g} s from the command's start: {spent['startup_s']:.1f} s"
                f" starting up, {spent['elapsed_s']:.1f} s in all"
                + (" (the budget ran out)" if spent["out_of_time"] else "")
            )
        for g in graph.values():
            print(
                f"graph of {g['config']}: edges {g['edges_covered']}/{g['edges']},"
                f" (action, outcome) pairs {g['pairs_covered']}/{g['pairs']}"
            )
    return 1 if failed is not None else 0


def _small(name: str) -> bool:
    from model_checks.explicit.pin import PINNED

    pinned = json.loads(PINNED.read_text()).get("configs", {}).get(name, {})
    return int(pinned.get("distinct_states", SMALL + 1)) <= SMALL


def _failure_text(adapter: EngineAdapter, res: RunResult) -> str:
    err = shrunk(adapter, res)
    return str(err) if err is not None else f"{type(res.failure).__name__}: {res.failure}"


def _coverage_json(cov: Coverage, shares: dict[str, tuple[int, int]]) -> dict[str, Any]:
    return {
        "actions": {a: cov.accepted[a] for a in ACTIONS},
        "actions_hit": sum(1 for a in ACTIONS if cov.accepted[a]),
        "actions_total": len(ACTIONS),
        "refusals": dict(cov.refused),
        "properties_nontrivial": {p.id: cov.properties[p.id] for p in SAFETY},
        "state_share": {k: {"visited": v, "states": n} for k, (v, n) in shares.items()},
    }


def _fuzz_json(
    results: list[RunResult],
    cov: Coverage,
    shares: dict[str, tuple[int, int]],
    detail: str | None,
) -> dict[str, Any]:
    return {
        "configs": [
            {
                "name": r.config,
                "examples": r.examples,
                "steps": r.steps,
                "seconds": round(r.seconds, 2),
                "failed": r.failed,
            }
            for r in results
        ],
        "coverage": _coverage_json(cov, shares),
        "failure": detail,
    }


def _print_fuzz(
    results: list[RunResult],
    cov: Coverage,
    shares: dict[str, tuple[int, int]],
    detail: str | None,
) -> None:
    con = console()
    t = Table(title="fuzzing the correct engine")
    for col in ("config", "examples", "steps", "seconds", "verdict"):
        t.add_column(col, justify="left" if col in ("config", "verdict") else "right")
    for r in results:
        verdict = "[red]DIVERGES[/red]" if r.failed else "conforms"
        t.add_row(r.config, str(r.examples), str(r.steps), f"{r.seconds:.1f}", verdict)
    con.print(t)
    _print_coverage(con, cov, shares)
    if detail is not None:
        print(detail)  # unwrapped: the program is JSON, one step a line


def _print_coverage(con: Console, cov: Coverage, shares: dict[str, tuple[int, int]]) -> None:
    t = Table(title="coverage: spec actions")
    for col in ("action", "accepted", "refused"):
        t.add_column(col, justify="left" if col == "action" else "right")
    for a in ACTIONS:
        cell = str(cov.accepted[a]) if cov.accepted[a] else "[red]0[/red]"
        t.add_row(a, cell, str(cov.refused_actions[a]))
    con.print(t)
    hit = sum(1 for a in ACTIONS if cov.accepted[a])
    con.print(f"actions accepted: {hit}/{len(ACTIONS)}", highlight=False)
    p = Table(title="coverage: safety properties")
    for col in ("property", "checked on non-trivial states", "refusals naming it"):
        p.add_column(col, justify="left" if col == "property" else "right")
    for prop in SAFETY:
        n = cov.properties[prop.id]
        p.add_row(prop.id, str(n) if n else "[red]0[/red]", str(cov.refused[prop.id]))
    con.print(p)
    live = sum(1 for pid in NONTRIVIAL if cov.properties[pid])
    con.print(f"properties checked where non-trivial: {live}/{len(NONTRIVIAL)}", highlight=False)
    for name, (v, n) in shares.items():
        con.print(f"abstract states visited on {name}: {v}/{n} ({100 * v / n:.1f}%)")


# --------------------------------------------------------------------- the kill matrix
def _matrix(args: argparse.Namespace, adapter: EngineAdapter, names: list[str]) -> int:
    err = Console(stderr=True)
    kills: list[Kill] = []

    def so_far() -> str:
        got = Counter("n/a" if k.killed is None else str(k.killed) for k in kills)
        late = sum(1 for k in kills if k.out_of_time)
        return f"killed {got['True']}, survived {got['False']}" + (
            f" ({late} out of time)" if late else ""
        )

    startup_s = since_start()
    with Progress("fuzz", len(names), "switches", summary=so_far) as bar:
        for i, name in enumerate(names):
            bar.update(note=f"hunting {name}")
            if not args.json:
                err.print(f"hunting {name} ...", highlight=False)
            # The first switch's budget counts from the command's start (imports included).
            first = i == 0 and args.seconds is not None
            kills.append(
                kill(
                    adapter,
                    name,
                    profile=args.profile,
                    examples=args.examples,
                    seconds=args.seconds,
                    deadline=Deadline(args.seconds, since=started()) if first else None,
                )
            )
            bar.advance()
    ok = all(k.killed for k in kills if k.applicable)
    if args.junit:
        write_junit(args.junit, "kvown fuzz --mutant", [_kill_case(k) for k in kills])
    if args.json:
        spent = {"seconds": args.seconds, "startup_s": round(startup_s, 2),
                 "elapsed_s": round(since_start(), 2)}  # fmt: skip
        print(json.dumps({"mutants": [k.to_json() for k in kills], "budget": spent}))
        return 0 if ok else 1
    t = Table(title="kill matrix (the machine against each bug switch)")
    for col in ("mutant", "config", "killed", "steps", "examples", "seconds", "caught by"):
        right = col in ("steps", "examples", "seconds")
        t.add_column(col, justify="right" if right else "left", no_wrap=col != "caught by")
    for k in kills:
        killed = "n/a" if k.killed is None else "yes" if k.killed else "[red]NO[/red]"
        if k.out_of_time:
            killed = "[red]NO (out of time)[/red]"
        t.add_row(
            k.name,
            k.config,
            killed,
            "-" if k.steps is None else str(k.steps),
            "-" if k.examples is None else str(k.examples),
            f"{k.seconds:.1f}",
            k.caught or k.message,
        )
    con = console()
    con.print(t)
    tally = Counter("n/a" if k.killed is None else str(k.killed) for k in kills)
    late = [k.name for k in kills if k.out_of_time]
    con.print(
        f"killed {tally['True']}, survived {tally['False']}, not applicable {tally['n/a']}"
        + (f"; out of time ({args.seconds:g} s each): {', '.join(late)}" if late else ""),
        highlight=False,
    )
    return 0 if ok else 1


def _kill_case(k: Kill) -> Case:
    """A switch's testcase passes when the machine kills it; n/a switches are skipped."""
    if k.killed is None:
        return Case("kvown.fuzz.mutants", k.name, k.seconds, skipped=k.message or "n/a")
    if k.killed:
        return Case("kvown.fuzz.mutants", k.name, k.seconds)
    msg = f"switch {k.name} survived {k.examples or 0} examples on {k.config}"
    if k.out_of_time:
        msg += " (its time budget ran out)"
    return Case("kvown.fuzz.mutants", k.name, k.seconds, f"SURVIVED: {msg}\n{k.message}", msg)
