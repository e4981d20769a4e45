"""Turn 1 of a conversation runs on decode, which keeps the session's KV when the turn
ends. The KV is then freed between turns (the session closed by decode, or evicted
under memory pressure), but the router's session table still names decode as its
holder and routes turn 2 there: the append would land on blocks that hold nothing of
the session (NothingLost).

The correct router routes to decode only while decode still holds the session's KV;
otherwise turn 2 falls back to prefill (the whole conversation is computed again).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.turns._turns import finish, turn_repro  # noqa: E402

PROPERTY = "NothingLost"
MUTANT = "append_after_evict"
COVERS = ("issue 22 item 5: turn 2 appended to decode KV evicted between turns",)
SCENARIO = "the session's KV is freed between turns; the router still routes turn 2 to decode"


def run(out: Out | None = print) -> Result:
    r, e = turn_repro(
        Path(__file__).stem,
        PROPERTY,
        MUTANT,
        __doc__ or "",
        out,
        "turn 2 is routed to decode (tn={tn}) while decode holds none of the session's KV (d={d})",
        "the route is refused: decode no longer holds the session",
    )
    return finish(r)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
