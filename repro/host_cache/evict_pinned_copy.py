"""r0's lookup hits the shared host copy of its prefix key and pins it (SGLang's
``exists``). Memory pressure unpublishes the copy, and the bug frees its pages at once,
whatever its pins: r0's load (``get``) has not begun and will read freed pages, which
the next store may already have reused. NoReuseUnderIO breaks.

The correct free waits for the pins to drain (phase two of a delete): r0 loads the
copy, its pin goes, and only then are the pages freed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.host_cache._hc import host_repro, prevented  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "evict_pinned_copy"
COVERS = ("issue 22 item 1; SGLang #31108 (a host page evicted between exists and get)",)
SCENARIO = "r0's lookup hit is pinned; the eviction frees the host copy anyway"
DAMAGE = (
    "the host copy's pages are free ({free} of {cap} host blocks) while {pins} pin still names them"
)
PREVENTED = (
    "HostFree is refused while r0's pin is on the copy; r0 loads it and the copy is freed after"
)


def run(out: Out | None = print) -> Result:
    r, _ = host_repro(
        Path(__file__).stem,
        PROPERTY,
        MUTANT,
        __doc__ or "",
        "NoReuseUnderIO",
        DAMAGE,
        out,
    )
    return prevented(r, "NoReuseUnderIO", PREVENTED)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
