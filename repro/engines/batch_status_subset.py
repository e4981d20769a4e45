"""The sender takes its transfer batch as done from the status of one task.

The transport has no revoke (a Mooncake or NIXL batch of one-sided writes). Prefill posts
r0's two blocks as two tasks of one batch. Task 0 completes; prefill gives up on its
timeout and reads the batch's status from task 0 alone (Mooncake TENT #2055: a batch
reported finished while other tasks were pending), so it frees its source and tells
decode Quiesced. Decode, trusting that word, frees its blocks; the next request writes
its KV there; then task 1, still in flight, lands and overwrites it: NoReuseUnderIO.

The correct sender cannot flush posted writes, so its timeout waits until every task of
the batch is done; only then does it free the source and say Quiesced.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems, msg, next_request_writes  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "batch_status_subset"
COVERS = ("issue #21 item 2: a batch status taken from a subset of its tasks",)
SCENARIO = "prefill's timeout reads the batch status from task 0; task 1 lands in freed blocks"
RECLAIM = msg("DecodeReclaim", "Quiesced", 1, 0)
LATE = msg("DecodeReceiveChunk", "Chunk", 1, 1)  # task 1: r0's block 1, still in flight


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    r.expect(e.p_status(0) == 0, "prefill freed r0's source with task 1 in flight")
    r.apply(e, RECLAIM)
    free = e.D.alloc.num_free
    r.expect(free == e.D.alloc.capacity, f"decode freed r0's blocks on Quiesced: {free} free")
    blocks, kv = next_request_writes(e, e.D, free)
    r.say(f"    the next request gets decode blocks {blocks} and writes its KV there")
    r.apply(e, LATE)
    n = diff_elems(e.D.gather(blocks), kv)
    r.expect(n > 0, f"task 1 overwrote {n} of {kv.numel()} elements of its KV")
    r.damage = (
        f"task 1 of r0's batch landed after the batch was declared done: {n} of "
        f"{kv.numel()} of the next request's KV elements in decode blocks {blocks} are r0's"
    )

    e, err = r.replay_without_bug("NoReuseUnderIO")
    waited = r.survives(e)
    r.prevented = (
        f"prefill's timeout is refused while task 1 is in flight ({type(err).__name__}); "
        f"the batch completes, then the attempt ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
