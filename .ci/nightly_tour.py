"""The nightly job's tour step: the graph tour of ``kvown fuzz --tour`` (every default
config's pair tour and the edge tours of ``refimpl.testing.tour.EDGE_TOURS``, every check
on every step), each world bounded by a budget of planned steps.

    python .ci/nightly_tour.py [--budget STEPS] [--slice I] [--json]

A world whose tour plans at most ``--budget`` steps (the drains not counted) is toured
whole, and its goal must be covered (every edge of an edge tour, every pair found).
A larger one (``handoff_crash``'s edge tour: 8,036 sequences, 135,653 steps, hours of
CPU) is toured by a slice: every k-th sequence, k = ceil(steps / budget), starting at
slice I (default: the day number mod k, so that k nights in a row tour every sequence
once). A slice must conform; its coverage is reported, not required.

Exit 0: every world conforms (and the whole ones cover their goal); 1 otherwise; the last
line of stdout is one summary ``tour: pass|FAIL: NAME ok|FAIL ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["BUDGET", "main", "slice_of", "worlds"]

BUDGET = 40_000  # planned steps per world (about 1 ms of CPU each, with every check)


def slice_of(n_sequences: int, steps: int, budget: int, index: int | None) -> tuple[int, int]:
    """(start, stride) of the sequences toured: all of them within the budget, else every
    k-th from ``index`` mod k (``index`` None: today's day number)."""
    k = max(1, math.ceil(steps / budget)) if steps > budget else 1
    k = min(k, max(1, n_sequences))
    if index is None:
        index = int(time.time() // 86_400)
    return (index % k, k)


def worlds() -> tuple[str, ...]:
    """The worlds toured, each once: every default config, then the edge tours not among
    them. (Once ``EDGE_TOURS[2:]``: offload_crash joined the default suite on 2026-12-07
    and was toured twice a night.)"""
    from refimpl.testing.tour import EDGE_TOURS
    from spec.config import DEFAULT_SUITE

    return tuple(dict.fromkeys((*DEFAULT_SUITE, *EDGE_TOURS)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=int, default=BUDGET, help="planned steps per world")
    p.add_argument("--slice", type=int, default=None, help="which slice of a large tour")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.budget < 1:
        p.error("--budget must be at least 1")

    from refimpl.testing import EngineAdapter
    from refimpl.testing.tour import TourPlan, plan_tour, report, run_tour
    from refimpl.testing.worlds import get_world

    adapter = EngineAdapter()
    rows: list[dict[str, object]] = []
    ok = True
    for name in worlds():
        plan = plan_tour(get_world(name))
        start, k = slice_of(len(plan.sequences), plan.steps, args.budget, args.slice)
        part = plan if k == 1 else TourPlan(**{**vars(plan), "sequences": plan.sequences[start::k]})
        res = run_tour(adapter, part)
        row = report(plan, res.coverage, steps=res.steps, cpu_seconds=round(res.seconds, 1))
        row.update(
            slice=f"{start}/{k}",
            sequences_run=res.sequences,
            failed=res.failed,
            plan_cpu_seconds=round(plan.seconds, 1),
        )
        whole = row["pairs_covered"] == row["pairs"] and (
            plan.goal != "edges" or row["edges_covered"] == row["edges"]
        )
        good = not res.failed and (k > 1 or whole)
        ok = ok and good
        row["verdict"] = "ok" if good else "FAIL"
        rows.append(row)
        note = f"slice {start}/{k}, " if k > 1 else ""
        print(
            f"{name}: {row['verdict']} ({plan.goal}, {note}{res.sequences} sequences,"
            f" edges {row['edges_covered']}/{row['edges']}, pairs {row['pairs_covered']}/"
            f"{row['pairs']}, {res.seconds:.0f} CPU s)",
            flush=True,
        )
        if res.failure is not None:
            print(str(res.failure))
    if args.json:
        print(json.dumps({"configs": rows, "ok": ok}))
    cpu = sum(float(r["cpu_seconds"]) + float(r["plan_cpu_seconds"]) for r in rows)  # type: ignore[arg-type]
    print(f"tour: {'pass' if ok else 'FAIL'}: {len(rows)} worlds, {cpu:.0f} CPU s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
