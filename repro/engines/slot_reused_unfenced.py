"""A late notification through a metadata slot that went to another request.

Decode has one metadata slot (SGLang's metadata buffer index with its bootstrap room,
vLLM's NIXL notification id). r0 is cancelled after its chunk landed; decode frees its
blocks and its slot at once, while r0's RankDone is still on the wire. r1 gets the slot.
The bug: decode resolves r0's late RankDone by the slot id alone and counts it for r1
(SGLang #17259: a first token read from another request's slot). r1's receiver now says
"every rank is done" although r1's sender never said so: Fencing breaks (a message of one
request changed another).

The correct decode matches a notification by its room: r0's is dropped.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "Fencing"
MUTANT = "slot_reused_unfenced"
COVERS = ("issue 21 item 8: a slot read after its request ended and the slot was reused",)
SCENARIO = "r0's late RankDone is counted for r1, the slot's new holder"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    r1 = e.rx[1]
    r.expect(r1.rmask == 1 and e.req[1].phase != 3, "r1 counts a rank its sender never reported")
    r.expect(e.req[1].sent == 0, f"r1's sender has sent {e.req[1].sent} items")
    r.damage = (
        "r1's receiver holds a RankDone that was r0's: it would validate r1 on r0's word"
        f" (r1 rmask {r1.rmask:b}, r1's sender sent {e.req[1].sent} items)"
    )

    e, exc = r.replay_without_bug(None)
    waited = r.survives(e)
    r.prevented = (
        f"r0's late RankDone carries r0's room and changes nothing for r1 ({type(exc).__name__});"
        f" r1 waits for its own and ends ({len(waited.steps)} steps)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
