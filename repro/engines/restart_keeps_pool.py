"""A restarted decode honours its dead incarnation's registration (Mooncake RFC #2832).

Decode (incarnation 0) reserves a block for r0 and answers Ready with its block ids and
remote keys; prefill takes it and starts its one-sided writes. Decode crashes and comes
back as incarnation 1 with an empty pool, under the same segment name and addresses.
Another request asks the new decode for blocks, gets the same block and writes its KV
there. Then prefill's write addressed to incarnation 0's registration arrives, and the
bug strikes: the new pool honours the old mapping, the write lands in the reused block,
and the next request decodes from r0's bytes (NoReuseUnderIO).

The correct decode registers its memory afresh on restart: a write carries the
incarnation of the registration it targets (the Ready's), and one of an older
incarnation fails at the invalid key and lands nowhere. Prefill, waiting in vain for an
Ack of the dead incarnation, fails the attempt closed on its own timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems, next_request_writes  # noqa: E402
from refimpl.replay.common import NEXT  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.properties import violated_safety  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "restart_keeps_pool"
COVERS = ("issue #21: restarts", "Mooncake RFC #2832 (a mapping reused after a restart)")
SCENARIO = "a write to a dead decode incarnation's registration lands in the restarted pool"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    _, steps = r.model_check()
    late = steps[-1]
    r.expect(late["action"] == "DecodeReceiveChunk", "the counterexample ends with the write")

    r.say(f"with the bug ({MUTANT}) on the reference engine:")
    e = r.engine(bug=True)
    r.run_steps(e, steps[:-1])
    r.expect(e.d_inc == 1 and e.D.alloc.num_free == e.D.alloc.capacity, "decode restarted empty")
    blocks, kv = next_request_writes(e, e.D, e.D.alloc.num_free)
    r.say(f"    the next request gets decode blocks {blocks} of the new pool and writes its KV")
    r.apply(e, late)
    now = e.D.gather(blocks)
    n = diff_elems(now, kv)
    r.expect(n > 0, f"the dead incarnation's write overwrote {n} of {now.numel()} elements")
    broken = violated_safety(e.abstract(), e.config)
    r.expect(PROPERTY in broken, f"the engine's state breaks {PROPERTY} {broken}")
    r.damage = (
        f"r0's write to incarnation 0's block landed in block {blocks[0]} of incarnation 1,"
        f" reallocated to the next request: {n} of {now.numel()} of its KV elements are foreign"
    )

    r.say("without the bug (the correct engine):")
    e = r.engine(bug=False)
    r.run_steps(e, steps[:-1])
    blocks, kv = next_request_writes(e, e.D, e.D.alloc.num_free)
    r.apply(e, late)
    r.expect(diff_elems(e.D.gather(blocks), kv) == 0, "the write failed: next KV intact")
    r.expect(e.damaged() == [], "no live replica is damaged")
    e.D.alloc.free(NEXT)  # the next request is done with its blocks
    waited = r.survives(e)
    r.prevented = (
        "the write names incarnation 0's registration, which the restarted decode no longer"
        f" has: it lands nowhere; prefill fails the attempt closed ({len(waited.steps)} steps)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
