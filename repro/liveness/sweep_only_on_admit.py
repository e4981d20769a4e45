"""The timeout sweep runs only when new work can be admitted.

Prefill freezes request r0 and decode reserves blocks for it; then the prefill worker
crashes. Decode's reserved blocks wait for chunks that will never come, and only a
timeout can free them. The bug: timeouts are checked only while some request can be
admitted, and with prefill down nothing ever can. Decode holds the blocks forever: no
quiescent end is reachable from here: NoDeadlock breaks. The bounded wait lets decode
take every enabled step, timeouts included, and sees the blocks leak.

The correct engine runs its timeouts whatever admission can do.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, held_blocks  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoDeadlock"
MUTANT = "sweep_only_on_admit"
COVERS = ("outline 12: the timeout sweep runs only when new work is admitted",)
SCENARIO = "prefill crashes; decode's timeouts wait for an admission that never comes"
BOUND = 60


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug(safety=False)
    waited = r.wait(e, max_steps=BOUND)
    r.say_steps(f"bounded wait, at most {BOUND} steps, timeouts included", waited.steps)
    held = held_blocks(e)
    r.expect(not waited.ended, f"no quiescent end ({waited.stuck}): {e.describe(0)}")
    r.expect(held["decode"] == e.D.alloc.capacity, f"decode's blocks leak: {held}")
    r.damage = (
        f"after the prefill crash decode's {held['decode']} reserved blocks are never freed "
        f"({waited.stuck}): the whole decode pool leaks"
    )

    e, _ = r.replay_without_bug(None)
    waited = r.survives(e, max_steps=BOUND)
    r.prevented = (
        f"decode's timeout fires after the crash and frees its blocks ({len(waited.steps)} "
        "steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
