"""A late message of an aborted attempt is counted by the next one.

Prefill starts handing request r0 to decode (attempt 1). Decode times out, fences
attempt 1 and sends a Nack; prefill takes r0 back and retries as attempt 2. Rank 0's
"done" of attempt 1 was still on the wire. The bug: decode counts a RankDone whatever
its epoch, so attempt 2's receiver marks rank 0 as finished before rank 0 has sent a
single byte of attempt 2: Fencing breaks. From then on decode's completion bookkeeping
describes a transfer that did not happen.

The correct decode fences by epoch: a message of another attempt changes nothing (it is
refused, then discarded), and attempt 2 completes on its own messages only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "Fencing"
MUTANT = "stale_epoch_accepted"
COVERS = ("outline 7: a late message from an aborted attempt accepted",)
SCENARIO = "attempt 1's late RankDone is counted by attempt 2 before attempt 2 sent anything"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    x, req = e.rx[0], e.req[0]
    r.expect(x.dep == 2 and x.rmask == 1, f"attempt {x.dep}'s receiver: ranks done {x.rmask:#04b}")
    r.expect(req.sent == 0, f"while attempt {req.epoch} has sent {req.sent} items")
    r.damage = (
        f"attempt {x.dep}'s receiver records rank 0 as done (ranks {x.rmask:#04b}) from attempt "
        f"1's message, before attempt {req.epoch} sent anything"
    )

    e, err = r.replay_without_bug("Fencing")
    waited = r.survives(e)
    r.prevented = (
        f"the stale RankDone is refused ({type(err).__name__}, Fencing) and discarded; "
        f"attempt 2 completes on its own messages ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
