"""A refetch after a retraction reuses the first attempt's epoch.

r0's handoff commits on decode; a Ready of that attempt was duplicated on the way and is
still in flight (its block ids: the decode blocks of attempt 1). Decode retracts r0
under memory pressure, and prefill computes it again. The bug: the refetch re-opens the
old epoch (the request keeps its room id), so prefill takes the late Ready for the new
attempt and writes r0's KV into the decode blocks the retraction freed, which another
request may already own: NoReuseUnderIO breaks (in an engine's log, the late Ready is
a Fencing breach).

The correct refetch is a new attempt (epoch 2): the Ready of epoch 1 is refused and
discarded, and the refetch runs on decode's own Ready of epoch 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import G_FOREIGN, NONE  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "retract_keeps_epoch"
COVERS = ("#21 item 5: a refetch that reuses the retracted attempt's room/epoch",)
SCENARIO = "a refetch after a retraction reuses epoch 1; a late Ready writes into freed blocks"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    req, x = e.req[0], e.rx[0]
    r.expect(req.epoch == 1 and x.dep == 1, f"the refetch runs under epoch {req.epoch}")
    r.expect(e.d_status(0) == NONE, "decode holds no blocks for r0 (the retraction freed them)")
    dst = req.dst
    e.step("DecodeReceiveChunk", {"req": 0, "msg": "Chunk", "epoch": 1, "idx": 0})
    r.expect(bool(e.req[0].ghost & G_FOREIGN), f"the chunk lands in freed decode blocks {dst}")
    r.damage = (
        f"the refetch's chunk landed in decode blocks {list(dst)}, freed by the retraction and "
        f"free for any request ({e.D.alloc.num_free} free)"
    )

    e, err = r.replay_without_bug("Fencing")
    waited = r.survives(e)
    r.prevented = (
        f"the refetch is epoch {e.req[0].epoch}: the late Ready of epoch 1 is refused "
        f"({type(err).__name__}, Fencing); r0 ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
