"""Pinned outcomes: ``spec/pinned.json`` records, per config, the result, distinct
states, edges and depth, and per mutant the config, expected property and shortest
counterexample length; the deep suite's configs under ``deep`` (measured only with
``--deep``: they take minutes). ``python -m model_checks.explicit.pin`` prints the drift
(exit 1 on any); ``--write`` rewrites the file (do that only on purpose, with the reason
in the commit; without ``--deep`` the pinned deep section is kept as it is).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import spec
from model_checks.explicit.runner import check_config, check_mutant
from spec.config import DEEP_SUITE, DEFAULT_SUITE
from spec.mutants import MUTANTS

PINNED = Path(spec.__file__).resolve().parent / "pinned.json"


def measure_config(name: str) -> dict[str, Any]:
    r = check_config(name)
    return {
        "result": "holds" if not r.violations else "violated: " + ",".join(sorted(r.violations)),
        "distinct_states": r.graph.n_states,
        "edges": r.graph.n_edges,
        "depth": r.graph.max_depth,
    }


def measure_mutant(name: str) -> dict[str, Any]:
    r = check_mutant(name)
    return {
        "config": r.config,
        "expected": r.expected,
        "result": "violated" if r.caught else "holds",
        "trace_length": r.trace_length,
    }


def measure(deep: bool = False) -> dict[str, Any]:
    out = {
        "configs": {n: measure_config(n) for n in DEFAULT_SUITE},
        "mutants": {n: measure_mutant(n) for n in MUTANTS},
    }
    if deep:
        out["deep"] = {n: measure_config(n) for n in DEEP_SUITE}
    return out


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(PINNED.read_text())
    return data


def drift(pinned: dict[str, Any], now: dict[str, Any]) -> list[str]:
    out = []
    for section in ("configs", "mutants", "deep"):
        if section not in now:
            continue
        for name in sorted(set(pinned.get(section, {})) | set(now[section])):
            a, b = pinned.get(section, {}).get(name), now[section].get(name)
            if a != b:
                out.append(f"{section}/{name}: pinned {a} != measured {b}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="rewrite spec/pinned.json")
    ap.add_argument("--deep", action="store_true", help="measure the deep suite too")
    args = ap.parse_args()
    now = measure(deep=args.deep)
    if args.write:
        if not args.deep and "deep" in load():
            now["deep"] = load()["deep"]
        PINNED.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {PINNED}")
        return 0
    problems = drift(load(), now)
    for p in problems:
        print(p)
    print("no drift" if not problems else f"{len(problems)} drifted")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
