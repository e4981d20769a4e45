"""Decode frees on its timeout as if it had fenced a write it cannot revoke.

The transport has no revoke (one-sided RDMA writes, a NIXL or Mooncake transfer batch:
``revocable=False``). Decode reserves blocks for r0 and tells prefill where to write,
then times out and frees them as though closing the connection had stopped the writes.
It has not: prefill, which got the Ready, posts chunk 0 to the same block addresses. The
next request asks decode for blocks, gets the same ones and writes its KV there; then
r0's chunk lands and overwrites part of it: NoReuseUnderIO breaks.

The correct decode gives the attempt up (Nack) but keeps its blocks quarantined while a
write may still land. The late write lands in quarantine, and the blocks are freed only
on prefill's Quiesced, which prefill sends once its own writes are done.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import (  # noqa: E402
    Out,
    Repro,
    Result,
    diff_elems,
    late_write_quarantined,
    msg,
    next_request_writes,
)
from repro._script import script_main  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "free_fenced_unrevocable"
COVERS = ("issue #21 item 2: a write that cannot be revoked",)
SCENARIO = "decode's timeout frees r0's blocks on a transport with no revoke; a late write hits"
LATE = msg("DecodeReceiveChunk", "Chunk", 1, 0)  # r0's chunk 0, posted after the timeout


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    r.expect(not e.wire.revocable, "the transport cannot take a posted write back")
    free = e.D.alloc.num_free
    r.expect(free == e.D.alloc.capacity, f"decode freed r0's blocks: {free} free, a write posted")
    blocks, kv = next_request_writes(e, e.D, free)
    r.say(f"    the next request gets decode blocks {blocks} and writes its KV there")
    r.apply(e, LATE)
    n = diff_elems(e.D.gather(blocks), kv)
    r.expect(n > 0, f"r0's write overwrote {n} of {kv.numel()} elements of its KV")
    r.damage = (
        f"r0's unrevocable write landed in decode blocks {blocks}, freed by the timeout and "
        f"reallocated: {n} of {kv.numel()} of the next request's KV elements are r0's bytes"
    )

    late_write_quarantined(r, LATE, "timed-out attempt")
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
