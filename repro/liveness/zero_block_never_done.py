"""A handoff with nothing to send never reports done.

Decode already holds request r0's whole prompt as a cached prefix, so the handoff has
zero blocks to send: only the per-rank "done" must go. The bug: with nothing to send,
prefill skips the RankDones too. Decode waits for them forever, and prefill keeps its
snapshot pinned waiting for decode's Ack: with no fault, no cancel and no timeout the
run can never end: FairTermination breaks. The bounded wait below lets both workers
take every enabled non-timeout step and sees r0 stuck.

The correct sender always sends each rank's RankDone, chunks or not.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, held_blocks  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import FINISHED  # noqa: E402

PROPERTY = "FairTermination"
MUTANT = "zero_block_never_done"
COVERS = ("outline 11: a full prefix hit has zero blocks to send; completion never reported",)
SCENARIO = "a full prefix hit leaves nothing to send; no RankDone goes and r0 never ends"
BOUND = 60  # steps of the bounded wait


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug(safety=False)
    waited = r.wait(e, timeouts=False, max_steps=BOUND)
    r.say_steps(f"bounded wait, at most {BOUND} non-timeout steps", waited.steps)
    held = held_blocks(e)
    r.expect(not waited.ended and e.req[0].status != FINISHED, f"r0 never ends ({waited.stuck})")
    r.expect(held["prefill"] > 0, f"its snapshot stays pinned: {held}; {e.describe(0)}")
    r.expect(not e.wire.entries("0>d"), "decode waits for a RankDone that was never sent")
    r.damage = (
        f"no RankDone for a zero-block handoff: r0 never ends ({waited.stuck}); prefill keeps "
        f"{held['prefill']} block pinned, decode keeps waiting"
    )

    e, _ = r.replay_without_bug(None)
    waited = r.survives(e, timeouts=False, max_steps=BOUND)
    r.expect(e.req[0].status == FINISHED, "r0 finishes without any timeout")
    r.prevented = (
        f"the RankDone goes even with zero blocks; r0 finishes with no timeout "
        f"({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
