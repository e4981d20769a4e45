"""A shared prefix block is evicted while a request still uses it.

Decode holds a cached prefix block that every prompt of this config starts with.
Request r0's handoff reuses it (a full prefix hit: decode references the cached block
instead of receiving it). The bug: the prefix cache evicts the block ignoring the
reference count. The allocator now calls the block free while r0's block table still
points at it; the next request that asks for blocks gets it and writes its own KV
there, and r0 attends over foreign bytes: CapacityRefcount breaks.

The correct cache evicts only blocks nobody references; r0's reference keeps the block.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.errors import OwnershipError  # noqa: E402
from refimpl.replay import Out, Repro, Result, diff_elems, next_request_writes  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "CapacityRefcount"
MUTANT = "evict_referenced_prefix"
COVERS = ("outline 15: a shared prefix block released while still referenced",)
SCENARIO = "the prefix cache evicts a block r0 references; the next request overwrites it"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    before = e.replica(0, "d")
    assert before is not None
    try:
        e.check_integrity()
        r.expect(False, "the allocator's integrity check sees the freed, referenced block")
    except OwnershipError as exc:
        r.expect(True, f"integrity check: {str(exc)[-60:]}")
    blocks, kv = next_request_writes(e, e.D, e.D.alloc.num_free)
    r.say(f"    the next request gets decode blocks {blocks} and writes its KV there")
    now = e.replica(0, "d")
    n = diff_elems(now, before)
    foreign = now is not None and any(torch.equal(now[0], kv[k]) for k in range(len(blocks)))
    r.expect(n > 0 and foreign, f"r0's prefix now holds the next request's KV ({n} elements)")
    r.damage = (
        f"the referenced prefix block was freed and handed out again: {n} of {before.numel()} "
        "elements of r0's KV are now the next request's (foreign) bytes"
    )

    e, err = r.replay_without_bug("CapacityRefcount")
    waited = r.survives(e)
    r.prevented = (
        f"eviction refused while r0 references the block ({type(err).__name__}, "
        f"CapacityRefcount); r0 decodes from it and ends ({len(waited.steps)} steps)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
