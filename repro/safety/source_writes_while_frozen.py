"""The source keeps writing after it froze its snapshot (seed failure 2, first half).

Prefill freezes request r0 for a handoff: the manifest it sends carries a checksum of
every block, and decode will install exactly those bytes. The bug: prefill's decode
loop is not stopped, so its next token is written into a block of the frozen snapshot.
The source now differs from what the manifest describes and from what decode will
receive, and both sides go on as if they held the same KV: FrozenSnapshot breaks.

The correct protocol makes a frozen block read-only until the handoff ends (Ack or Nack):
the write is refused, and the handoff goes on with the bytes it froze.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "FrozenSnapshot"
MUTANT = "source_writes_while_frozen"
COVERS = ("seed 2: source and target both keep writing",)
SCENARIO = "prefill appends a token into r0's frozen snapshot while the handoff is under way"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    rep, frozen = e.replica(0, "p"), e.frozen_truth[0]
    assert rep is not None and frozen is not None
    changed = [j for j in range(rep.shape[0]) if not torch.equal(rep[j], frozen[j])]
    n = diff_elems(rep, frozen)
    r.expect(
        e.damaged() == ["r0@p"], f"the frozen source no longer holds its snapshot {e.damaged()}"
    )
    r.expect(n > 0, f"{n} of {rep.numel()} elements of block(s) {changed} changed after the freeze")
    r.damage = (
        f"a token was written into frozen block(s) {changed}: {n} of {rep.numel()} elements "
        "differ from the snapshot the manifest's checksums describe"
    )

    e, err = r.replay_without_bug("FrozenSnapshot")
    waited = r.survives(e)
    r.prevented = (
        f"the write is refused ({type(err).__name__}, FrozenSnapshot); the handoff goes on "
        f"with the frozen bytes and r0 ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
