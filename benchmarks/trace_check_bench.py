"""Time ``kvown check-trace`` on a generated, conforming event log (default 100,000 events).

The spec's requests are a fixed set of slots, each with one lifecycle, so a long log is
two handoffs (config ``handoff_two``) stretched by long runs of token steps: prefill
steps of one request interleaved with decode steps of the other. Message deliveries
are left out of the log, so the checker has to assume them (a gap search at a few
events); every other event applies directly to the frontier.

    python benchmarks/trace_check_bench.py [--events N] [--out FILE]

Prints parse and check seconds and events per second. The issue asks for at most 60 s
for 100,000 events.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_checks.conformance import check_log, parse_log  # noqa: E402


def _e(action: str, req: int, **msg: int | str) -> str:
    args: dict[str, int | str] = {"req": req, **msg}
    return json.dumps({"action": action, "args": args})


def _handoff(req: int) -> list[str]:
    """One handoff of ``req`` with every delivery left out (4 steps are assumed)."""
    return [
        _e("PrefillFreeze", req),
        _e("DecodeReserve", req, msg="Handoff", epoch=1, idx=0),
        _e("PrefillSendChunk", req),  # its Ready delivery is assumed
        _e("PrefillSendChunk", req),
        _e("DecodeValidate", req),  # the Chunk and RankDone deliveries are assumed
        _e("DecodeCommit", req),
    ]


def generate(n_events: int) -> str:
    """A conforming ``handoff_two`` log of exactly ``n_events`` events (n >= 40)."""
    if n_events < 40:
        raise ValueError("need at least 40 events")
    head = [json.dumps({"format": "kvown-eventlog", "version": 1, "config": "handoff_two"})]
    start = [_e(a, r) for r in (0, 1) for a in ("PrefillAdmit", "PrefillRun")]
    mid = [*_handoff(0)]
    end_r0 = [_e("DecodeFinish", 0), _e("PrefillRelease", 0, msg="Ack", epoch=1, idx=0)]
    end_r1 = [*_handoff(1), _e("DecodeFinish", 1)]
    fixed = len(start) + len(mid) + len(end_r0) + len(end_r1)
    steps = n_events - fixed
    a, b, c = steps // 3, steps // 3, steps - 2 * (steps // 3)
    ev = list(start)
    ev += [_e("PrefillDecodeStep", k % 2) for k in range(a)]  # both prefilling
    ev += mid
    ev += [_e("DecodeStep", 0) if k % 2 else _e("PrefillDecodeStep", 1) for k in range(b)]
    ev += end_r0
    ev += [_e("PrefillDecodeStep", 1) for _ in range(c // 2)]
    ev += end_r1[:-1]
    ev += [_e("DecodeStep", 1) for _ in range(c - c // 2)]
    ev += end_r1[-1:]
    assert len(ev) == n_events, (len(ev), n_events)
    return "\n".join(head + ev) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--out", type=Path, help="also write the generated log here")
    args = ap.parse_args(argv)
    text = generate(args.events)
    if args.out:
        args.out.write_text(text)
    t0 = time.perf_counter()
    log = parse_log(text)
    t1 = time.perf_counter()
    verdict = check_log(log)
    t2 = time.perf_counter()
    total = t2 - t0
    print(f"events            {len(log.events)}")
    print(f"verdict           {'conforms' if verdict.conforms else 'VIOLATION'}")
    print(f"assumed steps     {len(verdict.assumed)}")
    print(f"parse seconds     {t1 - t0:.2f}")
    print(f"check seconds     {t2 - t1:.2f}")
    print(f"total seconds     {total:.2f}")
    print(f"events/s          {len(log.events) / total:,.0f}")
    return 0 if verdict.conforms else 1


if __name__ == "__main__":
    raise SystemExit(main())
