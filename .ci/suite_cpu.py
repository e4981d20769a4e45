"""The suite's CPU by folder, by kind and by test, from a ``KVOWN_CPU_LOG`` run
(tests/conftest.py writes ``PATH.<worker>``: one JSON line per test, its process's and
waited-for children's CPU seconds, setup to teardown).

    python .ci/suite_cpu.py /tmp/cpu_suite.log [--top 30] [--baseline /tmp/before.log]

prints markdown tables (benchmarks/RESULTS.md's suite section). A test's kind is its
file's: the first of KINDS whose pattern the file's text matches (so a file that does two
things counts as the first; the table says which pattern decided)."""

from __future__ import annotations

import argparse
import glob
import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (kind, pattern in the test file's text), first match wins: the costlier machinery first
KINDS = (
    ("cluster processes", r"refimpl\.cluster|\"cluster\"|'cluster'|kvown_cli\.cluster"),
    ("z3", r"\bz3\b|model_checks\.symbolic|model_checks\.proofs"),
    ("mutation (copies, judges)", r"model_checks\.mutation|refimpl\.testing\.mutate|mutate"),
    ("explorer", r"check_mutant|check_config|\bexplore\(|counterexample\(|measure_config"),
    ("tour", r"plan_tour|run_tour|tour_kill|graph_of"),
    ("Hypothesis", r"hypothesis"),
    ("CLI subprocesses", r"subprocess|Popen"),
)


def read(path: str) -> dict[str, float]:
    """test id -> CPU seconds (the last record of an id wins; ``@group`` suffix dropped)."""
    out: dict[str, float] = {}
    for f in sorted(glob.glob(glob.escape(path) + ".*")):
        for line in Path(f).read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                out[rec["id"].split("@", 1)[0]] = float(rec["cpu"])
    return out


def kind_of(file: str, cache: dict[str, str]) -> str:
    if file not in cache:
        p = ROOT / file
        text = p.read_text(encoding="utf-8") if p.exists() else ""
        cache[file] = next((k for k, pat in KINDS if re.search(pat, text)), "other")
    return cache[file]


def folder_of(file: str) -> str:
    parts = file.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def table(
    title: str,
    rows: dict[str, float],
    total: float,
    base: dict[str, float] | None,
    counts: dict[str, int],
    n_all: int,
) -> str:
    head = f"| {title} | tests | CPU s | share |" + (" before CPU s |" if base else "")
    sep = "|---|---:|---:|---:|" + ("---:|" if base else "")
    lines = [head, sep]
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1]):
        row = f"| `{k}` | {counts[k]} | {v:.0f} | {100 * v / total:.0f}% |"
        if base is not None:
            row += f" {base.get(k, 0.0):.0f} |"
        lines.append(row)
    lines.append(
        f"| **all** | {n_all} | **{total:.0f}** | 100% |"
        + (f" {sum(base.values()):.0f} |" if base else "")
    )
    return "\n".join(lines)


def group(cpu: dict[str, float], key) -> tuple[dict[str, float], dict[str, int]]:  # type: ignore[no-untyped-def]
    s: dict[str, float] = defaultdict(float)
    n: dict[str, int] = defaultdict(int)
    for tid, v in cpu.items():
        k = key(tid.split("::", 1)[0])
        s[k] += v
        n[k] += 1
    return s, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--baseline", help="an earlier run's log, for a before column")
    args = ap.parse_args()
    cpu = read(args.log)
    base = read(args.baseline) if args.baseline else None
    total = sum(cpu.values())
    kinds: dict[str, str] = {}
    for title, key in (
        ("folder", folder_of),
        ("kind", lambda f: kind_of(f, kinds)),
        ("file", lambda f: f),
    ):
        s, n = group(cpu, key)
        b = group(base, key)[0] if base is not None else None
        if title == "file":
            s = dict(sorted(s.items(), key=lambda kv: -kv[1])[: args.top])
        print(table(title, s, total, b, n, len(cpu)) + "\n")
    print(
        "| test | CPU s |"
        + (" before |" if base else "")
        + "\n|---|---:|"
        + ("---:|" if base else "")
    )
    for tid, v in sorted(cpu.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| `{tid}` | {v:.1f} |" + (f" {base.get(tid, 0.0):.1f} |" if base else ""))
    print(f"\n{len(cpu)} tests, {total:.0f} CPU s ({total / 60:.1f} CPU min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
