"""A partial transfer taken as complete (seed failure 3; sglang #30233).

Prefill (TP=2) hands request r0 (2 blocks) to decode (TP=1). Every rank reports "done",
but none of the 4 chunks has landed yet (in sglang #30233 the sender truncated the
request to 1 token and still marked the last chunk success). The bug: decode trusts the
RankDones, skips its own landed-blocks and checksum check, and validates. It now holds
pages that were never written and would decode from them: NoPartialUse breaks.

The correct decode validates only when every advertised chunk landed with its checksum;
until then it waits (or times out and fails the attempt, never succeeds).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoPartialUse"
MUTANT = "partial_as_complete"
COVERS = ("seed 3: partial transfer taken as complete", "incident 2: sglang #30233")
SCENARIO = "decode validates r0 on the RankDones alone, with none of its chunks landed"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    rep, frozen = e.replica(0, "d"), e.frozen_truth[0]
    assert rep is not None
    n, zeros = diff_elems(rep, frozen), int((rep == 0).sum())
    r.expect(e.damaged() == ["r0@d"], f"decode's validated copy is not r0's KV {e.damaged()}")
    r.expect(n > 0, f"{n} of {rep.numel()} elements differ from the snapshot ({zeros} are 0)")
    r.damage = (
        f"decode validated r0 with {bin(e.rx[0].landed).count('1')} of 4 chunks landed: "
        f"{n} of {rep.numel()} elements are not r0's KV ({zeros} never written)"
    )

    e, err = r.replay_without_bug("NoPartialUse")
    waited = r.survives(e)
    r.prevented = (
        f"validate is refused ({type(err).__name__}, NoPartialUse) until every chunk landed; "
        f"then r0 is installed byte-exact and ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
