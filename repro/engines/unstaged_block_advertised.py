"""The sender advertises a block it never staged.

Decode already holds block 0 (the cached prefix), so the sender sends block 1. The bug:
it sends block 1 before staging it (its compute or its copy into the send buffer is still
pending). The Handoff's hash is of block 1's tokens; the bytes on the wire are the send
buffer's old contents, checksummed by the sender as sent, so decode's per-chunk checksum
passes and the stale bytes land. It is the sender's fault (ContentIdentity), not the
network's: no fault was injected and none of the fault budget is spent. This engine's
end-to-end check against the manifest's block hashes would refuse the replica at
validation; a decode that trusts the per-chunk checksum would use it.

The correct sender waits until the block is staged.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems  # noqa: E402
from refimpl.replay.common import msg  # noqa: E402
from repro._attend import attend  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "ContentIdentity"
MUTANT = "unstaged_block_advertised"
COVERS = ("issue 21 item 7: a sender defect, blamed on the sender, not on the network",)
SCENARIO = "the sender sends a block it never staged; stale bytes pass the chunk checksum"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    r.run_steps(e, [msg("DecodeReceiveChunk", "ChunkUnstaged", 1, 0)])
    got, truth = e.replica(0, "d"), e.frozen_truth[0]
    assert got is not None and truth is not None
    n = diff_elems(got[1:], truth[1:])
    err = (attend(got) - attend(truth)).abs().max().item()
    r.expect(e.faults == 0, "no network fault was injected (the fault budget is untouched)")
    r.expect(n > 0, f"the chunk passed its checksum and block 1 holds stale bytes ({n} differ)")
    r.expect(err > 1e-3, f"an attention read over it is off by up to {err:.3f}")
    r.damage = (
        f"block 1 landed with the send buffer's stale bytes ({n} of {truth[1:].numel()}"
        f" elements wrong, attention off by up to {err:.3f}); decode's chunk checksum passed"
    )

    e, exc = r.replay_without_bug("ContentIdentity")
    waited = r.survives(e)
    r.prevented = (
        f"the send is refused until the block is staged ({type(exc).__name__}, ContentIdentity:"
        f" the sender's own guard); staged, it is sent and r0 ends ({len(waited.steps)} steps)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
