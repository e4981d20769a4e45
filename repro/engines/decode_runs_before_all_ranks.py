"""Decode TP=2 commits a request on one decode rank's install.

Prefill (TP=1) hands r0 to decode (TP=2): every chunk lands and validates, and each
decode rank must then install its shard (map the blocks into its own block table). The
bug: decode's scheduler reads rank 0's status only and commits after rank 0 installed.
Rank 1's attention then runs r0 with an empty block table: RankAgreement breaks.

The correct decode commits only when every decode rank has installed (vLLM's aggregator
waits for every worker's finished-recving; SGLang all-reduces the poll state).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import WRITABLE  # noqa: E402

PROPERTY = "RankAgreement"
MUTANT = "decode_runs_before_all_ranks"
COVERS = ("#21 item 6: decode TP ranks, the request runs before every rank installed",)
SCENARIO = "decode TP=2 commits r0 after rank 0's install; rank 1 has no block table for it"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    tables = e.tables()
    r.expect(e.d_status(0) == WRITABLE, "decode committed r0 (it may step)")
    r.expect((0, 0) in tables and (0, 1) not in tables, "rank 1 has not installed r0's shard")
    r.damage = (
        f"r0 committed with decode ranks {e.dmask_of(0):#04b} of 0b11 installed: rank 0 reads "
        f"blocks {list(tables[(0, 0)])}, rank 1 reads none of r0's KV"
    )

    e, err = r.replay_without_bug("RankAgreement")
    waited = r.survives(e)
    r.prevented = (
        f"the commit is refused ({type(err).__name__}, RankAgreement) until rank 1 installs; "
        f"then r0 runs on both ranks and ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
