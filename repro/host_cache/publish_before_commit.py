"""r0 computes its prompt and stores it into the shared host cache under its prefix
key. The bug publishes the key before the store wrote every block: a lookup now hits a
copy whose bytes are not there (gibberish on reload). PublishAfterCommit breaks.

The correct publish waits for every block of the current attempt.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.host_cache._hc import host_repro, prevented  # noqa: E402

PROPERTY = "PublishAfterCommit"
MUTANT = "publish_before_commit"
COVERS = ("issue 22 item 2; LMCache #4991, Mooncake #3030 (a key visible before all its bytes)",)
SCENARIO = "r0's store publishes the key before its block is written"
DAMAGE = "the key is published with {hl} of its blocks written"
PREVENTED = "HostPublish is refused until the block is in; then the key is published and used"


def run(out: Out | None = print) -> Result:
    r, _ = host_repro(
        Path(__file__).stem,
        PROPERTY,
        MUTANT,
        __doc__ or "",
        "PublishAfterCommit",
        DAMAGE,
        out,
    )
    return prevented(r, "PublishAfterCommit", PREVENTED)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
