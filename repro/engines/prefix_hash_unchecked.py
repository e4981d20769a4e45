"""A recycled prefix block is matched by the index alone, without its hash.

Decode caches a 1-block prefix that every prompt of this config starts with. Nobody
references it, so its block is reused for another request's KV; an index that lags (a
router's view built from KV events, a lookup by block id) still lists it. The bug:
decode counts it as a prefix hit without comparing the block's stored hash (reset on
reuse) with the hash the Handoff lists. r0's replica then starts with another request's
KV, and the attention a decode step computes over it is wrong: ContentIdentity breaks.

The correct decode compares the hashes: a miss, so the whole request is sent and the
replica equals the truth.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems  # noqa: E402
from refimpl.replay.common import msg, step  # noqa: E402
from repro._attend import attend  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "ContentIdentity"
MUTANT = "prefix_hash_unchecked"
COVERS = ("issue 21 item 7: a foreign prefix block used as the request's own",)
SCENARIO = "decode counts a recycled prefix block as a hit; decoding reads another request's KV"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    got, truth = e.replica(0, "d"), e.frozen_truth[0]
    assert got is not None and truth is not None
    n = diff_elems(got[:1], truth[:1])
    err = (attend(got) - attend(truth)).abs().max().item()
    r.expect(e.hit(0) == 1 and n > 0, f"r0's prefix block holds other KV ({n} elements differ)")
    r.expect(err > 1e-3, f"the attention read over it is off by up to {err:.3f}")
    r.damage = (
        f"r0 validated a replica whose prefix block is another request's KV: {n} of "
        f"{truth[:1].numel()} elements differ, attention output off by up to {err:.3f}"
    )

    e = r.engine(bug=False)
    first = [st for st in r.steps if st["action"] != "PrefillRecvReady"][:7]
    r.say("without the bug (the correct engine): the same steps up to the reservation")
    r.run_steps(e, first)
    r.expect(e.hit(0) == 0, "the stored hash does not match the manifest's: a miss, hit 0")
    rest = [msg("PrefillRecvReady", "Ready", 1, 0)]
    rest += [step("PrefillSendChunk", req=0)] * 3
    rest += [msg("DecodeReceiveChunk", "Chunk", 1, k) for k in range(2)]
    rest += [msg("DecodeReceiveDone", "RankDone", 1, 0), step("DecodeValidate", req=0)]
    r.run_steps(e, rest)
    ok = e.replica(0, "d")
    r.expect(ok is not None and torch.equal(ok, truth), "both blocks came from r0's sender")
    r.expect(ok is not None and torch.equal(attend(ok), attend(truth)), "the attention is right")
    waited = r.survives(e)
    r.prevented = (
        f"the hash compare turns the stale index entry into a miss: both blocks are sent,"
        f" the replica equals the truth, and r0 ends ({len(waited.steps)} more steps)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
