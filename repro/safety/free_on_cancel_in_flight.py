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
from refimpl.errors import OwnershipError  # noqa: E402
from refimpl.replay import Out, Repro, Result, diff_elems, msg, next_request_writes  # noqa: E402
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

    e, _ = r.replay_without_bug(None)
    q = e.D.alloc.quarantined("r0")
    r.expect(len(q) == 2, f"the aborted attempt's blocks {q} are quarantined, not free")
    try:
        next_request_writes(e, e.D, 1)
        r.expect(False, "a quarantined block cannot be reallocated")
    except OwnershipError as exc:
        r.expect(exc.prop == "CapacityRefcount", f"the next request is refused: {exc}")
    r.apply(e, LATE)
    r.expect(e.damaged() == [], "r0's late write lands in quarantine, harming nobody")
    waited = r.survives(e)
    r.prevented = (
        f"the aborted attempt's blocks {list(q)} stay quarantined (not reallocatable) until "
        f"prefill quiesces; then freed ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
