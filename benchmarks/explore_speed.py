"""Explicit model check speed: states per CPU second, this tree against another one.

For each config it runs what ``kvown check --config NAME`` runs (exploration, then
liveness on the same graph) in a fresh process, and reports distinct states, edges, CPU
seconds (exploration and liveness apart), wall seconds and distinct states per CPU
second. CPU time is the figure to compare on a shared machine: other jobs stretch the
wall clock, not the CPU time the check needs. With ``--baseline DIR`` (a checkout of an
older commit, e.g. ``git archive <commit> | tar -x -C DIR``) both trees are measured
in the same run, config by config, alternating, so drift in the machine's load hits both.

    python benchmarks/explore_speed.py [--baseline DIR] [--configs a,b] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run inside the measured tree (its own spec/ and model_checks/), one config per process.
_PROBE = """
import json, sys, time
from model_checks.explicit.explore import explore
from model_checks.explicit.liveness import check_liveness
from spec.config import get_config
c = get_config(sys.argv[1])
w0, c0 = time.perf_counter(), time.process_time()
g = explore(c)
c1 = time.process_time()
live = check_liveness(g)
c2, w2 = time.process_time(), time.perf_counter()
print(json.dumps({
    "config": c.name, "distinct_states": g.n_states, "edges": g.n_edges,
    "depth": g.max_depth, "holds": not g.first_violation and all(r.holds for r in live),
    "explore_cpu_s": round(c1 - c0, 3), "liveness_cpu_s": round(c2 - c1, 3),
    "cpu_s": round(c2 - c0, 3), "wall_s": round(w2 - w0, 3),
    "states_per_cpu_s": round(g.n_states / (c2 - c0)),
}))
"""


def measure(tree: Path, config: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, config],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    row: dict[str, object] = json.loads(out.stdout)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout to measure alongside")
    ap.add_argument("--configs", default="", help="comma-separated (default: the suite)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from spec.config import DEFAULT_SUITE

    names = [n for n in args.configs.split(",") if n] or list(DEFAULT_SUITE)
    trees = [("this", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    rows = []
    for name in names:
        for label, tree in trees:
            rows.append({"tree": label, **measure(tree, name)})
    if args.json:
        print(json.dumps(rows))
        return 0
    cols = ["tree", "config", "distinct_states", "edges", "depth", "holds"]
    cols += ["explore_cpu_s", "liveness_cpu_s", "cpu_s", "wall_s", "states_per_cpu_s"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    for label, _ in trees:
        mine = [r for r in rows if r["tree"] == label]
        cpu = sum(float(str(r["cpu_s"])) for r in mine)
        wall = sum(float(str(r["wall_s"])) for r in mine)
        states = sum(int(str(r["distinct_states"])) for r in mine)
        print(f"{label}: {states} states, {cpu:.2f} CPU s, {wall:.2f} wall s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
