"""Serial against parallel exploration (issue #25 item 3), side by side in one run.

For each config it runs ``check_config`` (exploration + liveness) with each worker count
and prints states, edges, verdicts, CPU seconds (the workers' included), wall seconds
and the load; the graphs must be the same (states, edges, verdicts), else exit 1.

    python benchmarks/parallel_explore.py [--config handoff_tp2to1] [--workers 1 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_checks.explicit.runner import check_config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", nargs="+", default=["handoff_tp2to1"])
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, ok = [], True
    for name in args.config:
        seen = set()
        for w in args.workers:
            r = check_config(name, workers=w)
            row = {
                "config": name,
                "workers": w,
                "states": r.graph.n_states,
                "edges": r.graph.n_edges,
                "violated": sorted(r.violations),
                "cpu_seconds": round(r.cpu_seconds, 2),
                "wall_seconds": round(r.seconds, 2),
                "load": round(os.getloadavg()[0], 1),
            }
            seen.add((row["states"], row["edges"], tuple(row["violated"])))
            rows.append(row)
            if not args.json:
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        ok = ok and len(seen) == 1
    if args.json:
        print(json.dumps({"runs": rows, "same": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
