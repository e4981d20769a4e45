"""A deferred store reads blocks that were already reused (incident 6: vllm #29870).

Request r0 is being offloaded: a store job copies its GPU blocks to host, one block per
step. The bug: the scheduler preempts r0 while the store is still running and frees its
GPU blocks. The next request (r1) is admitted into them and writes its own KV. The
store, when it runs on, reads r1's KV and files it under r0's name: NoReuseUnderIO
breaks, and a later reload of r0 would load r1's KV.

In the correct protocol the store pins its source blocks until it completes (or fails,
and its copy is never published): preemption of a request under a store is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, step  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "preempt_during_store"
COVERS = ("incident 6: vllm #29870",)
SCENARIO = "r0 is preempted while its store still reads its blocks; r1 reuses them"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.engine(bug=True)
    r.run_steps(e, r.steps[:-1])
    src = e.P.alloc.blocks_of("r0")  # the blocks r0's store reads
    e = r.replay_with_bug()
    r.run_steps(e, [step("PrefillAdmit", req=1), step("PrefillRun", req=1)])
    mine = e.P.alloc.blocks_of("r1")
    reused = [b for b in src if b in mine]
    r.expect(bool(reused), f"r1 got block(s) {reused} that r0's store still has to copy")
    truth1, frozen0 = e.truth[1], e.frozen_truth[0]
    assert truth1 is not None and frozen0 is not None
    b = reused[0]
    now = e.P.gather([b])[0]
    r.expect(
        torch.equal(now, truth1[mine.index(b)]) and not torch.equal(now, frozen0[src.index(b)]),
        f"block {b} holds r1's KV, not the r0 bytes the store was started for",
    )
    r.expect(e.H.alloc.blocks_of("r0") != (), "r0's store is still in flight on host")
    r.damage = (
        f"r0's GPU blocks {list(src)} were freed under its store; r1 now writes block {b}, so "
        "the store would file r1's KV under r0's name"
    )

    e, err = r.replay_without_bug("NoReuseUnderIO")
    waited = r.survives(e)
    r.prevented = (
        f"preemption under a store refused ({type(err).__name__}, NoReuseUnderIO); the store "
        f"completes and both requests end ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
