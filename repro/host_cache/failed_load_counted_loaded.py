"""A load from the shared host cache fails part-way and is counted as loaded.

r0's lookup hits the host copy of its prefix key, pins it and starts the load; the
copy's bytes then become unreadable (a read error of the host or disk tier). The bug
(Dynamo #15079: a failed disk load counted as loaded, another request's KV served):
the failed load is reported as loaded, so r0 runs on GPU blocks that were never read:
whatever they held before. NoPartialUse breaks (a load made usable without every
block read well).

The correct engine gives back the partly loaded blocks and the pin, unpublishes the
copy (the hit becomes a miss: vLLM's recompute policy invalidates the blocks), and r0 is
computed again from its tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from refimpl.replay.common import diff_elems  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import NONE, QUARANTINED, QUEUED  # noqa: E402
from spec.steps import whole_reload  # noqa: E402

PROPERTY = "NoPartialUse"
MUTANT = "failed_load_counted_loaded"
COVERS = ("#22 item 3: a failed load; Dynamo #15079 (a failed load counted as loaded)",)
SCENARIO = "r0's load from the host cache fails part-way and is counted as loaded"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    c, steps = r.model_check()
    e = r.engine(bug=True)
    r.run_steps(e, steps[:-1])
    before = e.abstract()
    r.apply(e, steps[-1])  # the failed load, reported as loaded
    r.expect(not whole_reload(before, "HostLoadFail", 0, 0, e.abstract(), c), "NoPartialUse")
    e.step("PrefillRun", {"req": 0})  # r0 runs on the loaded blocks
    bad = diff_elems(e.replica(0, "p"), e.truth[0])
    r.expect(e.damaged() == ["r0@p"] and bad > 0, f"r0's GPU KV is not its KV ({bad} elements)")
    r.damage = f"r0 runs on blocks the failed load never read: {bad} KV elements wrong"

    e, err = r.replay_without_bug(None)
    w = e.abstract()
    r.expect(w.reqs[0].st == QUEUED and w.reqs[0].p == NONE, "r0 waits, its blocks given back")
    r.expect(w.hc == QUARANTINED and w.hc_pin == 0, "the copy is unpublished, the pin gone")
    waited = r.survives(e)
    r.prevented = (
        "the hit becomes a miss: r0 is computed again and ends with its own KV "
        f"({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
