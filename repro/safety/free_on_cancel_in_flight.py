"""An abort frees blocks under an in-flight write (incident 1: vllm #32255).

Decode reserves blocks for request r0 and prefill starts writing r0's chunks into them
(one-sided writes to the block addresses decode gave it). The client cancels r0 and the
bug strikes: decode's abort frees the blocks at once although chunk 0 is still on its
way. The next request asks decode for blocks, gets the same ones and writes its own KV
there. Then r0's late chunk lands and overwrites part of the next request's KV:
NoReuseUnderIO breaks, and the next request decodes from foreign bytes.

The correct decode quarantines the blocks of an aborted attempt until the writer has
quiesced (or is fenced): they cannot be reallocated, the late write lands harmlessly in
quarantine, and the blocks are freed on prefill's Quiesced.
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
from spec import shardmap as sm  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "free_on_cancel_in_flight"
COVERS = ("incident 1: vllm #32255",)
SCENARIO = (
    "decode frees r0's blocks on cancel under an in-flight write; the next request's KV is hit"
)
LATE = msg("DecodeReceiveChunk", "Chunk", 1, 0)  # r0's chunk 0, still on the wire


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    free = e.D.alloc.num_free
    r.expect(
        free == e.D.alloc.capacity, f"decode freed r0's blocks: {free} free, a chunk in flight"
    )
    blocks, kv = next_request_writes(e, e.D, free)
    r.say(f"    the next request gets decode blocks {blocks} and writes its KV there")
    r.apply(e, LATE)
    now = e.D.gather(blocks)
    n = diff_elems(now, kv)
    frozen = e.frozen_truth[0]
    assert frozen is not None
    heads = sm.tp_heads(e.kv_heads, e.config.src_tp, 0)  # rank 0's heads: chunk 0's payload
    head = slice(heads.start, heads.stop)
    hit = now[0][:, :, head].equal(frozen[0][:, :, head])
    r.expect(n > 0, f"r0's late chunk overwrote {n} of {now.numel()} elements of its KV")
    r.expect(hit, "those elements are now r0's bytes (rank 0's heads of r0's block 0)")
    r.damage = (
        f"r0's late chunk landed in block {blocks[0]}, reallocated to the next request: "
        f"{n} of {now.numel()} of its KV elements are r0's (foreign) bytes"
    )

    late_write_quarantined(r, LATE, "aborted attempt")
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
