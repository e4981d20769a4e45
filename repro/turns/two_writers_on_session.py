"""Turn 2 of a conversation arrives while turn 1 still streams from decode (a client
that does not wait, a retry). The router sends it to decode, which appends turn 2's
prompt onto the session's KV while turn 1's decode steps still write it: two writers
on one session (SingleWriter).

The correct router routes a turn only once the session's previous turn has ended.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.turns._turns import finish, turn_repro  # noqa: E402

PROPERTY = "SingleWriter"
MUTANT = "two_writers_on_session"
COVERS = ("issue 22 item 5: one writer per session",)
SCENARIO = "turn 2 is routed to decode while turn 1 still decodes there"


def run(out: Out | None = print) -> Result:
    r, e = turn_repro(
        Path(__file__).stem,
        PROPERTY,
        MUTANT,
        __doc__ or "",
        out,
        "turn 2's append writes (tn={tn}) while turn 1 still decodes (ti={ti})",
        "the route is refused while the session's turn decodes",
    )
    return finish(r)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
