"""Time of every ``kvown prove`` claim, and the BMC depth reached per minute.

1. Every claim, one at a time in this process (``--jobs 1``: each claim's own time,
   undisturbed by the other worker), then the whole run as ``kvown prove`` runs it
   (``--jobs``, default 2): the wall time to compare with the 120 s budget.
2. On the correct spec, each default config is unrolled for ``--minutes`` (one minute
   by default): the depth reached, and the elapsed time at each depth (the per-depth
   cost grows with the depth; the config's BFS diameter is where BMC becomes
   exhaustive).

    python benchmarks/prove_bench.py [--minutes 1] [--jobs 2] [--skip-depth] [--json]

Machines are shared: a number is only as quiet as the machine was (see ``load`` in
the output, the 1-minute load average at the start of each part).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_checks.symbolic.bmc import CORRECT_DEPTH, SAFETY_IDS, bmc  # noqa: E402
from model_checks.symbolic.claims import run_all  # noqa: E402
from spec.config import CONFIGS  # noqa: E402


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def claims_part(jobs: int) -> dict[str, Any]:
    load = _load()
    t0 = time.perf_counter()
    claims = run_all(jobs=1)
    serial = time.perf_counter() - t0
    load2 = _load()
    t0 = time.perf_counter()
    again = run_all(jobs=jobs)
    wall = time.perf_counter() - t0
    groups: dict[str, float] = {}
    for c in claims:
        g = c.id.split(":")[0] if ":" in c.id else "induction"
        groups[g] = groups.get(g, 0.0) + c.seconds
    return {
        "load_serial": load,
        "serial_seconds": round(serial, 2),
        "load_parallel": load2,
        "jobs": jobs,
        "parallel_wall_seconds": round(wall, 2),
        "all_ok": all(c.ok for c in claims) and all(c.ok for c in again),
        "seconds_by_group": {k: round(v, 2) for k, v in groups.items()},
        "claims": [
            {"id": c.id, "method": c.method, "result": c.result, "seconds": round(c.seconds, 3)}
            for c in claims
        ],
    }


def depth_part(minutes: float) -> list[dict[str, Any]]:
    rows = []
    for name, c in CONFIGS.items():
        load = _load()
        res = bmc(c, frozenset(), SAFETY_IDS, 200, deadline_s=60.0 * minutes)
        rows.append(
            {
                "config": name,
                "load": load,
                "depth_reached": res.bound,
                "violation": res.depth,
                "seconds": round(res.seconds, 2),
                "claim_bound": CORRECT_DEPTH[name],
                "seconds_at_depth": [round(t, 2) for t in res.depth_seconds],
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=1.0, help="BMC time per config")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--skip-depth", action="store_true")
    ap.add_argument("--skip-claims", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    if not args.skip_claims:
        out["claims"] = claims_part(args.jobs)
    if not args.skip_depth:
        out["bmc_depth_per_minute"] = depth_part(args.minutes)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    if "claims" in out:
        cp = out["claims"]
        print(f"{'claim':40} {'method':10} {'result':9} {'seconds':>8}")
        for c in cp["claims"]:
            print(f"{c['id']:40} {c['method']:10} {c['result']:9} {c['seconds']:8.3f}")
        print(f"by group: {cp['seconds_by_group']}")
        print(
            f"serial (jobs=1): {cp['serial_seconds']}s (load {cp['load_serial']});"
            f" kvown prove (jobs={cp['jobs']}): {cp['parallel_wall_seconds']}s wall"
            f" (load {cp['load_parallel']}); all ok: {cp['all_ok']}"
        )
    if "bmc_depth_per_minute" in out:
        print(f"\ncorrect spec, BMC for {args.minutes:g} min per config:")
        for r in out["bmc_depth_per_minute"]:
            steps = r["seconds_at_depth"]
            tail = ", ".join(f"{k}:{t}s" for k, t in list(enumerate(steps))[-4:])
            print(
                f"  {r['config']:16} depth {r['depth_reached']:3} in {r['seconds']:6.1f}s"
                f" (claim bound {r['claim_bound']}; load {r['load']}; last depths {tail})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
