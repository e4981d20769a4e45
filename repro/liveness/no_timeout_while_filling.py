"""No timeout once the transfer has started (incident 7: sglang #31800).

Decode reserves blocks for request r0, and the first chunk lands: decode is filling
(sglang's Transferring). Then the rest never comes: the message was lost or prefill
stalled. The bug: decode's timeout is checked only before the first chunk, so r0's
blocks are never released and, under load, admission stops: BoundedExit breaks. The
bounded wait lets only decode move (its peer is gone), timeouts included.

In the correct protocol every non-terminal state has a bounded exit: decode's timeout
fences the attempt, frees its blocks and tells prefill, which retries or fails r0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, held_blocks  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "BoundedExit"
MUTANT = "no_timeout_while_filling"
COVERS = ("incident 7: sglang #31800",)
SCENARIO = "decode is filling r0 when its peer goes silent; no timeout frees the blocks"
BOUND = 60


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug(safety=False)
    waited = r.wait(e, actors=("D",), max_steps=BOUND)
    r.say_steps(f"bounded wait, decode alone, at most {BOUND} steps", waited.steps)
    held = held_blocks(e)["decode"]
    full = e.D.alloc.num_free == 0
    r.expect(held == e.D.alloc.capacity, f"decode holds {held} blocks forever ({waited.stuck})")
    r.expect(full, "its pool is full: no other request can be admitted")
    r.damage = (
        f"decode's {held} blocks of filling r0 are never released ({waited.stuck}); "
        "the decode pool is full and admission stops"
    )

    e, _ = r.replay_without_bug(None)
    waited = r.wait(e, actors=("D",), max_steps=BOUND)
    r.say_steps("bounded wait, decode alone", waited.steps)
    r.expect(held_blocks(e)["decode"] == 0, f"decode's timeout frees its blocks: {e.describe(0)}")
    rest = r.survives(e, max_steps=BOUND)
    r.prevented = (
        f"decode's timeout fences the attempt and frees its blocks ({len(waited.steps)} step); "
        f"prefill then takes r0 back and it ends ({len(rest.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
