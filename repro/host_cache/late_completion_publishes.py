"""r0's store into the host cache times out and is given up (PutRevoke). The writer's
completion of that attempt arrives late, and the bug takes it as the key's: the key is
marked complete with none of the current attempt's bytes. PublishAfterCommit breaks.

The correct engine names the attempt: a completion of an older one is a no-op on the
key, and its bytes are removed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.host_cache._hc import host_repro, prevented  # noqa: E402

PROPERTY = "PublishAfterCommit"
MUTANT = "late_completion_publishes"
COVERS = ("issue 22 item 2; Mooncake #3030, PR #3253 (a stale PutEnd of a given-up attempt)",)
SCENARIO = "a late completion of r0's given-up store publishes the key"
DAMAGE = "the key is published with {hl} blocks of its current attempt"
PREVENTED = "the late completion is a no-op and its bytes are freed; r1 misses and computes"


def run(out: Out | None = print) -> Result:
    r, _ = host_repro(
        Path(__file__).stem,
        PROPERTY,
        MUTANT,
        __doc__ or "",
        None,
        DAMAGE,
        out,
    )
    return prevented(r, None, PREVENTED)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
