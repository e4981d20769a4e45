"""Async scheduling frees blocks that a dispatched step still writes (vllm #45357).

With async scheduling the scheduler dispatches a step before the previous one's output
is processed, so a request can end (the client aborts, a stop token) while a step of it
is in flight. The bug: the request's blocks go back to the pool at once. The next
request is admitted into them and writes its own KV; then the dispatched step lands,
through the block table it was launched with, and overwrites that request's KV.
NoReuseUnderIO breaks: a step in flight is live I/O, and its blocks were freed under it.

In the correct engine the free waits for the step: the cancel is accepted at once, the
free (here prefill's quiesce) is refused while the step is in flight, and the blocks go
back only after the step's completion, whose output is discarded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, late_step_damage  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "free_with_step_in_flight"
COVERS = ("async scheduling: vllm #45357, vllm-ascend #14055",)
SCENARIO = "r0 is aborted while its step is in flight; its blocks are freed and reused at once"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    late_step_damage(
        r, "freed", "the step completes, its output is discarded, then the blocks are freed"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
