"""Turn 2 is routed to decode, which holds the session's KV: from this decision the
session's blocks are pinned until the append commits. The evictor ignores the pin and
frees them: the routed turn finds nothing to append onto (NothingLost), a
half-appended session.

The correct evictor takes only unpinned sessions between turns.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.turns._turns import finish, turn_repro  # noqa: E402

PROPERTY = "NothingLost"
MUTANT = "evict_pinned_session"
COVERS = ("issue 22 item 5: the session pinned from the routing decision until the append",)
SCENARIO = "decode evicts a session after turn 2 was routed to it"


def run(out: Out | None = print) -> Result:
    r, e = turn_repro(
        Path(__file__).stem,
        PROPERTY,
        MUTANT,
        __doc__ or "",
        out,
        "the routed turn (tn={tn}) finds its session's KV evicted (d={d})",
        "the eviction of a pinned session is refused",
    )
    return finish(r)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
