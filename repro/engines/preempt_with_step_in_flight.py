"""Async scheduling preempts a request whose step is still in flight (vllm-ascend #14055).

With async scheduling, step N+1 of request r0 is dispatched before step N's output is
processed. The bug: the scheduler preempts r0 (recompute) and returns its blocks to the
pool at once. The next request is admitted into them and writes its own KV; then r0's
dispatched step lands, through the block table it was launched with, and overwrites the
next request's KV. NoReuseUnderIO breaks: the step in flight is live I/O.

In the correct engine a preemption waits for the step in flight: it is refused until
the step completes; then r0 is preempted and its blocks are free for reuse.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, late_step_damage  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "preempt_with_step_in_flight"
COVERS = ("async scheduling: vllm-ascend #14055",)
SCENARIO = "r0 is preempted while its step is in flight; its blocks are reused at once"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    late_step_damage(r, "preempted", "the step completes and r0 runs to its end")
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
