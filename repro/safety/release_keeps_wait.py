"""The release frees the source but leaves the sender waiting for the Ack.

Prefill hands r0 to decode; decode validates and commits it (its copy is the writer now)
and sends the Ack. The bug: prefill's release frees the frozen source on the Ack but
does not clear the sender's wait state (``await_ack``): the handoff is over, yet its
timer still runs. No property of a state reads the sender phase alone, so the model
check's properties pass; INVARIANTS.md's ``Frozen`` (a sender that is not idle holds a
frozen source) breaks at the release. The damage follows: the stale handoff timer
fires and fails r0, a request decode has committed and is running, so decode drops
its KV and the client gets an error for a handoff that succeeded.

The correct release ends the attempt (sender idle): no timer is left, and r0 finishes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.invariants import broken_invariants  # noqa: E402
from spec.state import FAILED, FINISHED, IDLE, WRITABLE  # noqa: E402

PROPERTY = "Frozen"
MUTANT = "release_keeps_wait"
COVERS = ("issue 27 item 2: a release that keeps the wait state (INVARIANTS.md Frozen)",)
SCENARIO = "the release leaves the sender in await_ack; its stale timer fails a committed r0"
TIMEOUT = {"action": "PrefillTimeout", "args": {"req": 0}}


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    c, _ = r.model_check()
    e = r.replay_with_bug(safety=False)  # the properties hold: the conjunct breaks
    broken = broken_invariants(e.abstract(), c)
    r.expect(PROPERTY in broken, f"the engine's state breaks {PROPERTY} {broken}")
    r.expect(e.d_status(0) == WRITABLE, "decode has committed r0 and is its writer")
    r.apply(e, TIMEOUT)
    r.expect(e.req[0].status == FAILED, f"the stale handoff timer fails r0: {e.describe(0)}")
    waited = r.wait(e)
    r.say_steps("the engine runs on", waited.steps)
    r.expect(e.d_status(0) != WRITABLE, "decode dropped r0's committed KV")
    r.damage = (
        "the release left the sender in await_ack; its timer then failed r0, which decode had"
        " committed and was running, and decode dropped r0's KV"
    )

    e, _ = r.replay_without_bug(None)
    r.expect(e.req[0].phase == IDLE, "the release ends the attempt: the sender is idle")
    waited = r.survives(e)
    r.expect(e.req[0].status == FINISHED, "r0 finishes on decode")
    r.prevented = (
        f"the release clears the wait state: no handoff timer is left and r0 finishes"
        f" ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
