"""``kvown fuzz --tour``: the graph tour (``refimpl.testing.tour``) of every default config
and the edge-tour worlds, every check on every step, and its coverage report; ``--seconds``
bounds it (the tour stops before its next sequence and says so)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from kvown_cli.progress import Progress, console
from kvown_cli.reports.budget import hard_deadline
from kvown_cli.usage import started
from refimpl.testing import EngineAdapter
from refimpl.testing.run import BudgetSpent, Deadline
from refimpl.testing.worlds import get_world as get_config


def tour(args: argparse.Namespace, adapter: EngineAdapter) -> int:
    """``kvown fuzz --tour``: the tables (or JSON) of the tour, bounded by ``--seconds``."""
    from refimpl.testing.tour import EDGE_TOURS, plan_tour, report, run_tour
    from spec.config import DEFAULT_SUITE

    names = (args.config,) if args.config else (*DEFAULT_SUITE, *EDGE_TOURS[2:])
    deadline = Deadline(args.seconds, since=started())  # from the command's start
    rows: list[dict[str, Any]] = []
    cut = ""  # the config whose plan the budget cut
    failure: str | None = None
    err = Console(stderr=True)
    with Progress("fuzz --tour", None, "planned steps") as bar:
        # Every plan first (the explorations: a one-off), then the work left is known in
        # planned steps (the configs' tours differ 100-fold: a rate per config misleads).
        # The explorer and the planner check no deadline: a hard one cuts them.
        plans = []
        try:
            with hard_deadline(deadline):
                for name in names:
                    bar.update(note=f"planning {name}")
                    plans.append(plan_tour(get_config(name)))
        except BudgetSpent:
            cut = f" while planning {names[len(plans)]}, before any tour ({len(plans)} of"
            cut += f" {len(names)} configs planned)"
        bar.total = sum(p.steps for p in plans)
        bar.start_work()
        for name, plan in zip(names, plans, strict=False):
            bar.update(note=f"touring {name}")
            if not args.json:
                err.print(f"touring {name} ...", highlight=False)
            res = run_tour(adapter, plan, deadline=deadline)
            rows.append(
                report(
                    plan,
                    res.coverage,
                    steps=res.steps,
                    probes=res.probes,
                    plan_cpu_seconds=round(plan.seconds, 2),
                    cpu_seconds=round(res.seconds, 2),
                    failed=res.failed,
                )
            )
            bar.advance(sum(len(q) for q in plan.sequences[: res.sequences]))
            if res.failure is not None:
                failure = str(res.failure)
                break
            if deadline.passed():
                break
    whole = all(
        r["pairs_covered"] == r["pairs"]
        and (r["goal"] != "edges" or r["edges_covered"] == r["edges"])
        for r in rows
    )
    out_of_time = deadline.passed() and failure is None
    if out_of_time:
        whole = False
        done = f" after {len(rows)} of {len(names)} configs (the last one partly)"
        print(
            f"kvown fuzz --tour: the {args.seconds:g} s budget ran out{cut or done}",
            file=sys.stderr,
        )
    if args.json:
        out = {"configs": rows, "complete": whole, "failure": failure, "out_of_time": out_of_time}
        print(json.dumps(out))
    else:
        t = Table(title="the graph tour (every check on every step)")
        cols = ("config", "goal", "states", "edges", "pairs", "sequences", "steps", "cpu s")
        for col in (*cols, "verdict"):
            t.add_column(col, justify="left" if col in ("config", "goal", "verdict") else "right")
        for r in rows:
            verdict = "[red]DIVERGES[/red]" if r["failed"] else "conforms"
            t.add_row(
                r["config"],
                r["goal"],
                str(r["states"]),
                f"{r['edges_covered']}/{r['edges']}",
                f"{r['pairs_covered']}/{r['pairs']}",
                str(r["sequences"]),
                str(r["steps"]),
                f"{r['plan_cpu_seconds'] + r['cpu_seconds']:.1f}",
                verdict,
            )
        console().print(t)
        for r in rows:
            if r["pairs_missed"]:
                print(f"{r['config']}: pairs not exercised: {', '.join(r['pairs_missed'])}")
        if failure is not None:
            print(failure)
    return 0 if failure is None and whole else 1
