"""Sliding-window pruning frees a block an offload store still reads (issue #32 item 3).

Request r0 runs with a windowed attention: its oldest block falls out of the window and
the engine frees it while r0 keeps running (vLLM's ``remove_skipped_blocks``). Here r0 is
being offloaded: a store job copies its GPU blocks to host, one block per step. The bug:
the prune frees r0's oldest block although the store has still to copy it. The next
request is given the block and writes its own KV there; the store, when it runs on,
copies that KV into r0's host copy (NoReuseUnderIO), and a reload of r0 would read
another request's KV.

In the correct protocol a frozen copy that a store or a handoff still reads is never
pruned: the prune is refused (NoReuseUnderIO) until the store is done, and the request
runs on to its end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, step  # noqa: E402
from refimpl.replay.repro import next_request_writes  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "window_prunes_under_io"
COVERS = ("issue #32 item 3: sliding-window pruning under a store (vLLM remove_skipped_blocks)",)
SCENARIO = "r0's oldest block is pruned out of its window while its store still reads it"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.engine(bug=True)
    r.run_steps(e, r.steps[:-1])
    src = e.p_table(0)  # the block table r0's store reads, logical order
    e = r.replay_with_bug()
    r.expect(e.P.alloc.blocks_of("r0") == src[1:], f"r0 keeps its window {src[1:]}")
    mine, kv = next_request_writes(e, e.P, 1)
    r.expect(mine == [src[0]], f"the next request got block {mine}, r0's pruned {src[0]}")
    r.apply(e, step("PrefillOffloadCopy", req=0))  # the store copies r0's logical block 0
    host, frozen = e.H.gather(e.H.alloc.blocks_of("r0")[:1])[0], e.frozen_truth[0]
    assert frozen is not None
    r.expect(
        torch.equal(host, kv[0]) and not torch.equal(host, frozen[0]),
        "r0's host copy of block 0 holds the next request's KV, not r0's",
    )
    r.damage = (
        f"r0's block {src[0]} was pruned under its store; the next request wrote it, and "
        "the store filed that KV under r0's name in its host copy"
    )
    e, err = r.replay_without_bug("NoReuseUnderIO")
    waited = r.survives(e)
    r.prevented = (
        f"the prune under the store is refused ({type(err).__name__}, NoReuseUnderIO); the"
        f" store completes and r0 ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
