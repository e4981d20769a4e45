"""``kvown fuzz --tour --impl api``: the graph tour on the public API, its report.

Each world's spec closed under the API's eager steps, replayed on real Senders/Receiver
with the refinement map after every step: every edge of the small worlds
(``EDGE_WORLDS``), every reachable (action, outcome) pair of the others
(``on_api.pairs``). The report lists what was covered and every divergence class found,
with its reason where ``gaps`` names it. A world whose features the API cannot run is
refused naming them (``UNEXPRESSED``). ``--across-processes``: the Receiver in its own OS
process over ``DistTransport`` (``on_api.remote``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from refimpl.testing.on_api.adapter import UNEXPRESSED, ApiAdapter, unexpressed
from refimpl.testing.on_api.gaps import GAPS
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.remote import RemoteDecode
from refimpl.testing.on_api.tour import ApiPlan, api_report, plan_api, run_api_tour
from refimpl.testing.run import BudgetSpent
from refimpl.testing.worlds import get_world

__all__ = ["API_WORLDS", "EDGE_WORLDS", "complete", "plan_for", "render", "tour_api"]

API_WORLDS = ("mismatch_one", "net_one", "handoff_crash")  # the default: small worlds
# toured edge by edge; others by pairs
EDGE_WORLDS = frozenset(
    {
        *API_WORLDS,
        "crash_both",
        "handoff_decode_fail",
        "handoff_tp1to2",
        "pair_ranks_fail",
        "ranks_tp2_one",
        "ranks_faults_one",
        "ranks_restart_one",
        "offload_contend",
        "full_hit_one",  # a zero-block handoff from decode's cached prefix
    }
)
COLUMNS = ("config", "goal", "edges", "covered", "sequences_diverged", "seconds")


def plan_for(name: str) -> ApiPlan:
    """The API tour of world ``name``: its edges in ``EDGE_WORLDS``, its pairs elsewhere."""
    c = get_world(name)
    return plan_api(c) if name in EDGE_WORLDS else plan_api_pairs(c)


def complete(row: dict[str, Any]) -> bool:
    """Did the tour take its whole goal, with no divergence?"""
    if row["goal"] == "pairs":
        took = row["pairs_covered"] == row["pairs"]
    else:
        took = row["edges_covered"] == row["edges"]
    return took and not row["divergences"]


def _covered(row: dict[str, Any]) -> str:
    if row["goal"] == "pairs":
        return f"{row['pairs_covered']}/{row['pairs']} pairs"
    return f"{row['edges_covered']}/{row['edges']} edges"


def render(rows: list[dict[str, Any]], remote: bool = False) -> str:
    """The report as text: one row per world, then every divergence class and its reason."""
    cells = [{**r, "covered": _covered(r)} for r in rows]
    table = [COLUMNS, *(tuple(str(r[k]) for k in COLUMNS) for r in cells)]
    widths = [max(len(row[k]) for row in table) for k in range(len(COLUMNS))]
    lines = ["the graph tour on refimpl.api (the spec closed under its eager steps)"]
    if remote:
        lines.append("the Receiver in its own OS process, over DistTransport (gloo)")
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in table]
    for r in rows:
        for gap, n in r["divergences"].items():
            kind, why = GAPS.get(gap, ("new", "not named in refimpl/testing/on_api/gaps.py"))
            lines.append(f"{r['config']}: {n} x {gap} [{kind}]: {why}")
    return "\n".join(lines)


def tour_api(
    args: Any,
    refuse: Callable[[str], int],
    budget: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
) -> int:
    """Run the tour for ``args.config`` (None: ``API_WORLDS``); 0 when its goal was
    covered and nothing diverged, 1 otherwise; ``refuse(message)`` on misuse (exit 2).
    ``budget()``: each world's plan and tour run in it; a ``BudgetSpent`` it raises ends
    the tour there (that world dropped, reported out of time: exit 1)."""
    if not args.tour:
        return refuse("--impl api is for --tour (the machine and the matrix drive the engine)")
    remote = getattr(args, "across_processes", False)
    names = (args.config,) if args.config else API_WORLDS
    for name in names:
        if bad := unexpressed(get_world(name), remote):
            why = "; ".join(f"{b}: {UNEXPRESSED[b]}" for b in bad)
            return refuse(f"--impl api cannot run {name!r} ({why})")
    rows = []
    late = None  # the world the budget cut
    with contextlib.ExitStack() as stack:
        rd = stack.enter_context(RemoteDecode()) if remote else None
        for name in names:
            try:
                with budget():
                    plan = plan_for(name)
                    rows.append(api_report(plan, run_api_tour(ApiAdapter(remote=rd), plan)))
            except BudgetSpent:
                late = name
                break
    clean = late is None and all(complete(r) for r in rows)
    if args.json:
        out = {"impl": "api", "across_processes": remote, "configs": rows, "complete": clean}
        print(json.dumps({**out, "out_of_time_in": late}))
    else:
        print(render(rows, remote))
    if late is not None:
        print(
            f"kvown fuzz --tour --impl api: the budget ran out in {late} after {len(rows)}"
            f" of {len(names)} worlds",
            file=sys.stderr,
        )
    return 0 if clean else 1
