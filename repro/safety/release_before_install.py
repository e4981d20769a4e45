"""The source frees the KV before the target has installed it (seed failure 1).

Prefill (TP=2) freezes request r0 and hands it to decode (TP=1). The bug: prefill frees
its blocks as soon as every chunk and RankDone is *posted*, without waiting for decode's
Ack. The chunks are still on the wire, so for a while no complete copy of r0's KV exists
anywhere: NothingLost breaks. When one chunk is then lost, decode times out and asks
the source to take r0 back, but the source has nothing left. r0 is stuck for good.

The correct protocol keeps the frozen snapshot pinned until the Ack (or a Nack) comes,
so the same loss costs one retry at most.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, held_blocks, msg  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import FINISHED  # noqa: E402

PROPERTY = "NothingLost"
MUTANT = "release_before_install"
COVERS = ("seed 1: source frees KV before target installs",)
SCENARIO = "prefill frees r0's blocks once its chunks are posted; a lost chunk then loses r0"
LOSE = msg("EnvLose", "Chunk", 1, 1)  # the config's one network fault: rank 0's block 1


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    in_flight = len(e.wire.entries("0>d"))
    r.expect(held_blocks(e)["prefill"] == 0, f"prefill holds no block, {in_flight} sends in flight")
    r.apply(e, LOSE)
    waited = r.wait(e)
    r.say_steps("then one chunk is lost; the engine runs on", waited.steps)
    r.expect(not waited.ended, f"r0 never ends ({waited.stuck}): {e.describe(0)}")
    gone = all(e.replica(0, w) is None for w in "phd")
    r.expect(gone, "no copy of r0's KV is left in any pool (prefill, host, decode)")
    r.damage = (
        f"prefill freed r0's blocks with {in_flight} sends in flight; after one lost chunk no "
        f"copy of r0's KV exists anywhere and r0 never ends ({waited.stuck})"
    )

    e, _ = r.replay_without_bug(None)
    pinned = e.P.alloc.refcount(e.P.alloc.blocks_of("r0")[0])
    r.expect(pinned == 2, "the source blocks stay pinned by the snapshot until the Ack")
    r.apply(e, LOSE)
    waited = r.survives(e)
    r.expect(e.req[0].status == FINISHED, "r0 finishes from the intact source")
    r.prevented = (
        "the snapshot stays pinned until decode's Ack; after the same loss decode's Nack "
        f"gives r0 back to the source, which finishes it ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
