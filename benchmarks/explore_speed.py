"""Explicit model check speed: each technique on and off, config by config, in one run.

For each config it runs what ``kvown check --config NAME`` runs (exploration, then
liveness on the same graph) in a fresh process per mode, and reports distinct states,
edges, CPU seconds (exploration and liveness apart), states per CPU second and peak
memory (the process's maximum resident set). CPU time is the figure to compare on a
shared machine: other jobs stretch the wall clock, not the CPU time the check needs.

Modes (``model_checks.explicit.explore``'s switches):

- ``off``: every technique off: the plain core, no symmetry, no reduction;
- ``plain``: the plain core with symmetry (the explorer before the local core);
- ``local``: the local core (learned local edges, interned ids) with symmetry;
- ``auto``: what ``kvown check`` runs now (local for two or more requests, else plain);
- ``por``: the local core with symmetry and partial-order reduction (safety and
  transition properties only: no liveness on a reduced graph).

The cuts are ratios of CPU seconds (and of states for symmetry and POR) in the same run:
``off/auto`` (everything against nothing), ``plain/auto`` (the new core against the old
path), ``off/plain`` (symmetry), ``states local/por`` (partial-order reduction).
With ``--baseline DIR`` (an older checkout) its default ``explore`` is measured too.

    python benchmarks/explore_speed.py [--configs a,b] [--deep] [--modes off,plain,...]
                                       [--baseline DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("off", "plain", "local", "auto", "por")
_ARGS = {
    "off": "core='plain', symmetry=False",
    "plain": "core='plain'",
    "local": "core='local'",
    "auto": "",
    "por": "core='local', por=True",
    "baseline": "",
}

# Run inside the measured tree (its own spec/ and model_checks/), one config per process.
_PROBE = """
import json, resource, sys, time
from model_checks.explicit.explore import explore
from model_checks.explicit.liveness import check_liveness
from spec.config import get_config
c = get_config(sys.argv[1])
live_too = sys.argv[2] == "1"
w0, c0 = time.perf_counter(), time.process_time()
g = explore(c, {args})
c1 = time.process_time()
live = check_liveness(g) if live_too else []
c2, w2 = time.process_time(), time.perf_counter()
print(json.dumps({{
    "config": c.name, "distinct_states": g.n_states, "edges": g.n_edges,
    "depth": g.max_depth, "holds": not g.first_violation and not g.first_step_violation
    and all(r.holds for r in live),
    "explore_cpu_s": round(c1 - c0, 3), "liveness_cpu_s": round(c2 - c1, 3),
    "cpu_s": round(c2 - c0, 3), "wall_s": round(w2 - w0, 3),
    "states_per_cpu_s": round(g.n_states / max(c2 - c0, 1e-9)),
    "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
}}))
"""


def measure(tree: Path, config: str, mode: str) -> dict[str, object]:
    probe = _PROBE.format(args=_ARGS[mode])
    out = subprocess.run(
        [sys.executable, "-c", probe, config, "0" if mode == "por" else "1"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    row: dict[str, object] = {"mode": mode, **json.loads(out.stdout)}
    return row


def _ratio(a: object, b: object) -> str:
    x, y = float(str(a)), float(str(b))
    return f"{x / y:.2f}x" if y > 0 else "-"


def cuts(rows: list[dict[str, object]]) -> dict[str, str]:
    """The ratios of one config's rows (by mode)."""
    by = {str(r["mode"]): r for r in rows}
    out: dict[str, str] = {}
    for name, a, b, col in (
        ("off/auto cpu", "off", "auto", "cpu_s"),
        ("plain/auto cpu", "plain", "auto", "cpu_s"),
        ("plain/local explore cpu", "plain", "local", "explore_cpu_s"),
        ("off/plain states", "off", "plain", "distinct_states"),
        ("local/por states", "local", "por", "distinct_states"),
        ("local/por explore cpu", "local", "por", "explore_cpu_s"),
        ("baseline/auto cpu", "baseline", "auto", "cpu_s"),
    ):
        if a in by and b in by:
            out[name] = _ratio(by[a][col], by[b][col])
    if "por" in by and "local" in by:
        out["por verdict same"] = str(by["por"]["holds"] == by["local"]["holds"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="", help="comma-separated (default: every pinned one)")
    ap.add_argument("--deep", action="store_true", help="the pinned deep suite's configs too")
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--baseline", type=Path, help="another checkout to measure alongside")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from model_checks.explicit.pin import load

    pinned = load()
    names = [n for n in args.configs.split(",") if n] or [
        *pinned["configs"],
        *(pinned.get("deep", {}) if args.deep else {}),
    ]
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"unknown mode(s) {', '.join(bad)}; valid modes: {', '.join(MODES)}")
        return 2
    rows: list[dict[str, object]] = []
    table: list[tuple[str, dict[str, str]]] = []
    for name in names:
        mine = [{"tree": "this", **measure(ROOT, name, m)} for m in modes]
        if args.baseline:
            mine.append({"tree": "baseline", **measure(args.baseline, name, "baseline")})
        rows.extend(mine)
        table.append((name, cuts(mine)))
        if not args.json:
            _print_rows(mine, header=name == names[0])
    if args.json:
        print(json.dumps({"rows": rows, "cuts": dict(table)}))
        return 0
    print()
    for name, cut in table:
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in cut.items()))
    for m in [*modes, *(["baseline"] if args.baseline else [])]:
        mine = [r for r in rows if r["mode"] == m]
        cpu = sum(float(str(r["cpu_s"])) for r in mine)
        states = sum(int(str(r["distinct_states"])) for r in mine)
        print(f"{m}: {states} states, {cpu:.2f} CPU s in all")
    return 0


_COLS = ("config", "mode", "distinct_states", "edges", "depth", "holds", "explore_cpu_s")
_COLS += ("liveness_cpu_s", "cpu_s", "states_per_cpu_s", "peak_mb")


def _print_rows(rows: list[dict[str, object]], header: bool) -> None:
    if header:
        print(" | ".join(_COLS))
    for r in rows:
        print(" | ".join(str(r[c]) for c in _COLS), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
