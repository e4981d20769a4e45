"""Cost per event of the online ``Monitor`` (the issue's goal: at most 5 us per event).

The log is ``trace_check_bench``'s generated, conforming ``handoff_two`` log (default
100,000 events: two handoffs stretched by token steps, deliveries left out so that a
few events need a gap search). The engine hands the monitor parsed objects
(``Monitor.feed``); the cost of a raw line (``feed_line``: strict JSON parse too) is
measured beside it, in the same run.

    python benchmarks/monitor_bench.py [--events N] [--repeat R]

Prints the best of R runs of each, in microseconds per event.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trace_check_bench import generate  # noqa: E402
from model_checks.conformance import Monitor  # noqa: E402


def _run(items: Sequence[object], as_lines: bool) -> float:
    """Seconds to feed ``items`` to a fresh Monitor (parsed objects, or raw lines) and close it."""
    m = Monitor()
    feed = m.feed_line if as_lines else m.feed
    t0 = time.perf_counter()
    for item in items:
        feed(item)  # type: ignore[arg-type]
    v = m.close()
    dt = time.perf_counter() - t0
    if not v.conforms:
        raise SystemExit(f"the generated log should conform: {v.reason}")
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.events < 40 or args.repeat < 1:
        ap.error("--events must be >= 40 and --repeat >= 1")
    lines = generate(args.events).splitlines()
    objs = [json.loads(x) for x in lines]
    n = len(lines) - 1  # the header is not an event
    per_obj = min(_run(objs, as_lines=False) for _ in range(args.repeat)) / n * 1e6
    per_line = min(_run(lines, as_lines=True) for _ in range(args.repeat)) / n * 1e6
    print(f"events                 {n}")
    print(f"Monitor.feed      us   {per_obj:.2f} per event (goal <= 5)")
    print(f"Monitor.feed_line us   {per_line:.2f} per event (strict JSON parse included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
