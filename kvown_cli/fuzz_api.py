"""``kvown fuzz --tour --impl api``: the graph tour on the public API (``refimpl.api``).

Every edge of each world's spec closed under the API's eager steps, replayed on real
Senders/Receiver (``refimpl.testing.on_api``) with the refinement map after every step;
the report lists the edges covered and every divergence class found, each with its
reason where ``on_api.gaps`` names it. A world whose features the API cannot run is
refused naming them (``on_api.adapter.UNEXPRESSED``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from kvown_cli.progress import console
from kvown_cli.usage import refuse
from refimpl.testing.worlds import get_world

API_WORLDS = ("mismatch_one", "net_one", "handoff_crash")  # the default: small, seconds each


def tour_api(args: argparse.Namespace) -> int:
    from refimpl.testing.on_api import (
        UNEXPRESSED,
        ApiAdapter,
        api_report,
        plan_api,
        run_api_tour,
        unexpressed,
    )
    from refimpl.testing.on_api.gaps import GAPS

    names = (args.config,) if args.config else API_WORLDS
    for name in names:
        if bad := unexpressed(get_world(name)):
            why = "; ".join(f"{b}: {UNEXPRESSED[b]}" for b in bad)
            return refuse("fuzz", f"--impl api cannot run {name!r} ({why})", args.json)
    rows: list[dict[str, Any]] = []
    for name in names:
        plan = plan_api(get_world(name))
        rows.append(api_report(plan, run_api_tour(ApiAdapter(), plan)))
    clean = all(r["edges_covered"] == r["edges"] and not r["divergences"] for r in rows)
    if args.json:
        print(json.dumps({"impl": "api", "configs": rows, "complete": clean}))
        return 0 if clean else 1
    t = Table(title="the graph tour on refimpl.api (the spec closed under its eager steps)")
    for col in ("config", "spec edges", "closed edges", "covered", "diverged", "cpu s"):
        t.add_column(col, justify="left" if col == "config" else "right")
    for r in rows:
        t.add_row(
            r["config"],
            str(r["spec_edges"]),
            str(r["edges"]),
            str(r["edges_covered"]),
            f"{r['sequences_diverged']}/{r['sequences']}",
            str(r["seconds"]),
        )
    out = console()
    out.print(t)
    for r in rows:
        for gap, n in r["divergences"].items():
            kind, why = GAPS.get(gap, ("new", "not named in refimpl/testing/on_api/gaps.py"))
            out.print(f"{r['config']}: {n} x {gap} [{kind}]: {why}", highlight=False, markup=False)
    return 0 if clean else 1
