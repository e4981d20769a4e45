"""r0's lookup pins the shared host copy; the bug drops the pin when the load starts
instead of when it completes. The pin count (0) no longer covers the load in flight, so
an eviction may free the copy under it: CapacityRefcount breaks (the pins are not the
hits and loads).

The correct engine keeps the pin until HostLoadCommit.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.host_cache._hc import host_repro, prevented  # noqa: E402

PROPERTY = "CapacityRefcount"
MUTANT = "unpin_at_load_start"
COVERS = ("issue 22 item 1 (the pin dropped when the load starts: an eviction under the load)",)
SCENARIO = "the lookup's pin is dropped when r0's load starts"
DAMAGE = "the copy has {pins} pins while r0's load still reads it: a free would pass"
PREVENTED = "the pin stays until the load completes; r0 loads and runs"


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
