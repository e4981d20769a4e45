"""A cancelled request's transfer is neither interrupted nor discarded (seed failure 5).

Prefill hands request r0 to decode and sends every chunk; then the client cancels r0.
The bug: decode ignores the cancel. It keeps receiving, validates the chunks that land
after the cancel and commits them, so a request nobody wants holds prefill and decode
blocks and becomes decode's to run: StickyEnd breaks (cancelled is not final any more).

In the correct protocol cancelled is sticky: nothing is validated or committed after it.
Decode refuses the install, prefill quiesces its own writes, and decode then reclaims
the blocks the transfer was writing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, held_blocks, step  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import CANCELLED, WRITABLE  # noqa: E402

PROPERTY = "StickyEnd"
MUTANT = "cancel_ignored"
COVERS = ("seed 5: cancellation neither interrupts nor discards the in-flight transfer",)
SCENARIO = "the client cancels r0 mid-transfer; decode still validates and commits it"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    cancel = next(k for k, st in enumerate(r.steps) if st["action"] == "ClientCancel")
    after = len(r.steps) - cancel - 1
    e = r.replay_with_bug()
    r.apply(e, step("DecodeCommit", req=0))
    held = held_blocks(e)
    w = e.abstract().reqs[0]
    r.expect(w.st == CANCELLED and w.d == WRITABLE, f"cancelled r0 is committed: {e.describe(0)}")
    r.expect(held["prefill"] + held["decode"] == 4, f"r0 still holds blocks {held}")
    r.damage = (
        f"{after} transfer steps after the cancel are taken and installed; the cancelled r0 is "
        f"committed on decode, holding {held['prefill']} prefill + {held['decode']} decode blocks"
    )

    e, err = r.replay_without_bug("StickyEnd")
    waited = r.survives(e)
    r.prevented = (
        "the install after the cancel is refused (StickyEnd); prefill quiesces, decode "
        f"reclaims: every block freed in {len(waited.steps)} steps"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
