"""r0 and r1 both hit the shared host copy of their prefix key and pin it. r0's load
completes, and the bug consumes the copy (frees it, as a per-request swap-in does):
r1's pin names freed pages. NoReuseUnderIO breaks.

The correct load keeps the shared copy: only r0's pin goes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.host_cache._hc import host_repro, prevented  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "reload_consumes_shared"
COVERS = ("issue 22 item 1 (a reload consumes the shared host copy, as a swap-in does)",)
SCENARIO = "r0's reload frees the shared host copy while r1's lookup has pinned it"
DAMAGE = (
    "the shared copy is freed ({free} of {cap} host blocks free) while {pins} pin (r1's) remains"
)
PREVENTED = "r0's load leaves the copy; r1 loads it too and both run"


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
