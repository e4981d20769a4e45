"""The share of ``Unmodelled`` verdicts on the mutated-log corpus (issue #21, item 10).

The corpus (``model_checks/conformance/corpus.py``) is every conforming log of
``repro/traces`` (``ok_*``, ``fixed_*``) with one event dropped, doubled, or swapped with
the next: the issue's measure ("298 of 715 verdicts are Unmodelled"; its 715 counts the
logs refused as malformed too). ``--all`` adds the bug and incident logs, ``--epochs``
the edits that move a message's epoch by one. Each edited log is judged by
``check_text``; the Unmodelled ones are grouped by the action at the failing line and
the reason the verdict's ``unmodelled`` detail gives (its kind and the guard's missing
conjuncts), the most common first.

    python benchmarks/unmodelled_rate.py [--all] [--epochs] [--top N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_checks.conformance import UNMODELLED, LogError, check_text  # noqa: E402
from model_checks.conformance.corpus import CONFORMING, corpus  # noqa: E402


def _reason(d: dict[str, Any] | None) -> str:
    if d is None:
        return "no detail"
    needs = ", ".join(d["needs"]) or "-"
    return f"{d['kind']}: needs {needs}"


def measure(prefixes: tuple[str, ...], epochs: bool) -> dict[str, Any]:
    verdicts = malformed = conforming = 0
    props: Counter[str] = Counter()
    groups: Counter[tuple[str, str]] = Counter()
    kinds: Counter[str] = Counter()  # (the detail's kind, the edit)
    example: dict[tuple[str, str], str] = {}
    for name, what, text in corpus(prefixes, epochs=epochs):
        try:
            v = check_text(text)
        except LogError:
            malformed += 1
            continue
        verdicts += 1
        if v.conforms:
            conforming += 1
            continue
        props[v.violated or "?"] += 1
        if v.violated == UNMODELLED:
            d = v.unmodelled
            key = (d["action"] if d else str((v.event or {}).get("action")), _reason(d))
            groups[key] += 1
            kinds[f"{d['kind'] if d else '?'} after {what.split()[0]}"] += 1
            example.setdefault(key, f"{name} {what}")
    unmodelled = props[UNMODELLED]
    return {
        "cases": verdicts + malformed,
        "verdicts": verdicts,
        "malformed": malformed,
        "conforming": conforming,
        "unmodelled": unmodelled,
        "share": unmodelled / verdicts if verdicts else 0.0,
        "properties": dict(props.most_common()),
        "kinds": dict(kinds.most_common()),
        "groups": [
            {"action": a, "reason": r, "count": n, "example": example[(a, r)]}
            for (a, r), n in groups.most_common()
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="mutate the bug and incident logs too")
    ap.add_argument("--epochs", action="store_true", help="add the epoch edits")
    ap.add_argument("--top", type=int, default=40, help="Unmodelled groups printed")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    a = ap.parse_args(argv)
    prefixes = (*CONFORMING, "bug_", "incident") if a.all else CONFORMING
    t0 = time.perf_counter()
    r = measure(prefixes, a.epochs)
    r["seconds"] = round(time.perf_counter() - t0, 1)
    print(
        f"corpus: logs {', '.join(p + '*' for p in prefixes)}; edits drop, double, swap"
        + (", epoch+-1" if a.epochs else "")
    )
    print(
        f"{r['cases']} edited logs: {r['malformed']} malformed (LogError),"
        f" {r['verdicts']} verdicts, {r['conforming']} conform"
    )
    print(f"Unmodelled: {r['unmodelled']} of {r['verdicts']} verdicts ({100 * r['share']:.1f}%)")
    print("verdicts by property: " + ", ".join(f"{p} {n}" for p, n in r["properties"].items()))
    print("Unmodelled by kind and edit: " + ", ".join(f"{k} {n}" for k, n in r["kinds"].items()))
    print("\n| count | action at the failing line | reason | example |\n|---|---|---|---|")
    for g in r["groups"][: a.top]:
        print(f"| {g['count']} | {g['action']} | {g['reason']} | {g['example']} |")
    print(f"\n{r['seconds']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
