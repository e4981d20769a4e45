"""One rank's duplicated completion is counted for a rank that never reported.

Prefill (TP=2) hands request r0 to decode; both ranks write their chunks. Rank 0's
RankDone is duplicated by the network, and rank 1 has not reported yet. The bug: decode
counts RankDone messages instead of distinct ranks, so two messages from rank 0 look
like "both ranks done", and decode validates while rank 1's sender is still running:
RankAgreement breaks. (vLLM #46240 is the same family: a completion seen twice, handled
twice.)

The correct decode keeps a set of ranks: a duplicate counts once, and validate waits
for rank 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import SENDING  # noqa: E402

PROPERTY = "RankAgreement"
MUTANT = "duplicate_rank_counted"
COVERS = ("outline 10: a duplicate completion counted for a missing rank",)
SCENARIO = "rank 0's RankDone arrives twice and is counted as both ranks; decode validates"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    x = e.rx[0]
    r.expect(x.rcnt == 2 and x.rmask == 1, f"counted {x.rcnt} RankDones from ranks {x.rmask:#04b}")
    r.expect(e.req[0].phase == SENDING, "rank 1's sender has not finished when decode validates")
    r.damage = (
        f"decode validated r0 on {x.rcnt} RankDones, both from rank 0 (ranks {x.rmask:#04b} of "
        "0b11), while rank 1 was still sending"
    )

    e, err = r.replay_without_bug("RankAgreement")
    waited = r.survives(e)
    r.prevented = (
        f"validate refused ({type(err).__name__}, RankAgreement: ranks are a set); it goes "
        f"through once rank 1 reports ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
