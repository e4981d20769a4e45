"""A failed load keeps its stale hit, and the request livelocks (vLLM #49176).

The shared host copy of r0's prefix key becomes unreadable (a read error). r0's lookup
hits it, its load fails, and the bug leaves the copy published: the next lookup hits
the same copy, the load fails again, and so on. Only an eviction (memory pressure,
which a quiet server never sees) or a cancel ends it: RecoverWithoutTimeout breaks. The
bounded wait takes the engine's own enabled steps (timeouts only when nothing else can)
and sees the same load fail over and over.

The correct engine turns the hit into a miss (unpublishes the copy): the next lookup
misses and r0 is computed again.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "RecoverWithoutTimeout"
MUTANT = "failed_load_keeps_hit"
COVERS = ("issue 22 item 3; vLLM #49176 (a failed load keeps its stale hit: livelock)",)
SCENARIO = "r0's load of an unreadable host copy fails, and the next lookup hits it again"
BOUND = 40


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug(safety=False)
    waited = r.wait(e, max_steps=BOUND)
    fails = sum(1 for s in waited.steps if s.startswith("HostLoadFail"))
    r.say_steps(f"bounded wait, at most {BOUND} steps", waited.steps[:12])
    r.expect(not waited.ended and fails >= 3, f"{fails} failed loads of the same copy")
    r.damage = f"the same stale hit is loaded and fails {fails} times in {BOUND} steps"

    e, _ = r.replay_without_bug(None)
    rest = r.survives(e, max_steps=BOUND)
    fails = sum(1 for s in rest.steps if s.startswith("HostLoadFail"))
    r.expect(fails <= 2, f"each request's load fails at most once ({fails})")
    r.prevented = (
        f"the hit becomes a miss after the failed load: both requests are computed and end "
        f"({len(rest.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
