"""Scale curve of the explicit model check, and the symmetry-reduction factor.

For growing configs (1, 2, 3 requests: ``spec.config.SCALE``) it explores each with and
without symmetry reduction in the same run and prints distinct states, edges, seconds,
states/s and the reduction factor (unreduced states / reduced states). Then the default
suite, timed end to end (exploration + liveness), as ``kvown check`` runs it.

    python benchmarks/model_check_scale.py [--max-requests 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_checks.explicit.explore import explore  # noqa: E402
from model_checks.explicit.runner import check_suite  # noqa: E402
from spec.config import SCALE  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-requests", type=int, default=3, choices=(1, 2, 3, 4))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-suite", action="store_true", help="skip the default-suite timing")
    args = ap.parse_args()
    rows = []
    for k in range(1, args.max_requests + 1):
        c = SCALE[f"scale_{k}"]
        red = explore(c, symmetry=True, max_states=10_000_000)
        full = explore(c, symmetry=False, max_states=10_000_000)
        rows.append(
            {
                "config": c.name,
                "requests": k,
                "distinct_states": red.n_states,
                "edges": red.n_edges,
                "seconds": round(red.seconds, 3),
                "states_per_s": round(red.n_states / red.seconds),
                "unreduced_states": full.n_states,
                "unreduced_seconds": round(full.seconds, 3),
                "symmetry_factor": round(full.n_states / red.n_states, 3),
            }
        )
    suite = None
    if not args.no_suite:
        t0 = time.perf_counter()
        results = check_suite()
        wall = time.perf_counter() - t0
        states = sum(r.graph.n_states for r in results)
        bfs = sum(r.graph.seconds for r in results)
        suite = {
            "distinct_states": states,
            "seconds_total": round(wall, 3),
            "seconds_exploring": round(bfs, 3),
            "states_per_s_exploring": round(states / bfs),
            "all_hold": all(not r.violations for r in results),
        }
    if args.json:
        print(json.dumps({"scale": rows, "default_suite": suite}))
        return 0
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    if suite is not None:
        print("\ndefault suite (kvown check):", json.dumps(suite))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
