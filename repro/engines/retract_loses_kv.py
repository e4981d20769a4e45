"""Decode retracts a committed request under memory pressure and keeps it running.

Decode's KV pool is full, so its scheduler retracts r0, whose handoff has committed and
whose source prefill has already released on the Ack: decode's blocks are the only copy.
The bug (sglang #31905: a decode retraction with no host copy keeps the request to
resume from one): the blocks are freed, but r0 stays in the running batch. Its next
step reads KV that no longer exists anywhere: NothingLost breaks.

The correct decode marks a retracted request for recompute (preempted): prefill computes
it again and hands it off under a new epoch (the refetch), which commits and finishes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import NONE, PREEMPTED, RUNNING  # noqa: E402

PROPERTY = "NothingLost"
MUTANT = "retract_loses_kv"
COVERS = ("#21 item 5: decode retraction; sglang #31905 (resume from a copy never made)",)
SCENARIO = "decode retracts committed r0 and frees its blocks, but keeps it running"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    req = e.req[0]
    where = {w: e.replica(0, w) is not None for w in ("p", "d", "h")}
    r.expect(req.status == RUNNING, "r0 is still running after the retraction")
    r.expect(
        e.p_status(0) == e.d_status(0) == e.h_status(0) == NONE,
        f"no replica of r0 is left (held: {where})",
    )
    r.damage = (
        "r0 runs on with no KV anywhere: decode freed its blocks, prefill released its source "
        f"on the Ack; {e.D.alloc.num_free} decode blocks free for the next request"
    )

    e, err = r.replay_without_bug(None)
    r.expect(e.req[0].status == PREEMPTED, "the correct retraction marks r0 for recompute")
    waited = r.survives(e)
    r.prevented = (
        "r0 is preempted (marked for recompute), computed again on prefill and ends "
        f"({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
