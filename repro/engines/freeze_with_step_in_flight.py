"""A handoff freezes a snapshot that a dispatched step still writes (async scheduling).

With async scheduling a decode step of r0 on prefill is dispatched before the previous
one's output is processed. The bug: the handoff freezes r0's blocks as its snapshot
(checksums taken, manifest sent) while that step is still in flight. The step then
lands in the frozen blocks: the snapshot decode is about to read is no longer the one
whose checksums the manifest carries. FrozenSnapshot breaks: a step in flight writes a
replica that is not writable.

In the correct engine the freeze waits for the step in flight: it is refused until the
step completes, and the snapshot then includes the step's token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, step  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "FrozenSnapshot"
MUTANT = "freeze_with_step_in_flight"
COVERS = ("async scheduling: a handoff snapshot taken under an in-flight step",)
SCENARIO = "r0's handoff freezes its blocks while a dispatched step still writes them"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    frozen = e.frozen_truth[0]
    assert frozen is not None
    before = e.P.gather(e.P.alloc.blocks_of("r0")).clone()
    r.apply(e, step("PrefillStepComplete", req=0))
    after = e.P.gather(e.P.alloc.blocks_of("r0"))
    r.expect(torch.equal(before, frozen), "the snapshot held its frozen bytes at the freeze")
    r.expect(not torch.equal(after, frozen), "the step's late write changed the frozen snapshot")
    r.expect(e.damaged() == ["r0@p"], f"the frozen source differs from its snapshot {e.damaged()}")
    r.damage = (
        "r0's snapshot was frozen (checksums in the manifest) under a dispatched step; the "
        "step's completion wrote its token into the frozen blocks decode is about to read"
    )

    e, err = r.replay_without_bug("FrozenSnapshot")
    waited = r.survives(e)
    r.prevented = (
        f"the freeze under the step is refused ({type(err).__name__}, FrozenSnapshot); the "
        f"step completes and r0 runs to its end ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
