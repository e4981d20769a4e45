"""A streamed layer reported ready while it sits only in the receiver's staging copy.

One request streamed layer by layer (``Config.layers``), received through staging (a
block-size change). ``layer_ready`` tells the engine it may read the layer from the
blocks it was given; with the bug a layer is reported ready as soon as it is in staging,
before ``DecodeInstallLayer`` moved it into those blocks: the engine reads zeros and
commits with no error (NoPartialUse; issue #30 bug 1).

The correct receiver reports a layer ready only once it is installed: the report is
refused (NoPartialUse) and changes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoPartialUse"
MUTANT = "layer_ready_on_staging"
COVERS = ("issue #30 bug 1: layer_ready while the layer is only in staging",)
SCENARIO = "a layer is reported ready from staging, before it is in the engine's blocks"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    bad = [i for i, q in enumerate(e.abstract().reqs) if q.rdy > q.inl]
    r.expect(bool(bad), f"a layer reported ready but not installed: r{bad}")
    r.damage = (
        f"r{bad[0] if bad else '?'}: a layer was reported ready while the blocks the engine"
        " reads did not hold it yet (only staging did)"
    )
    r.replay_without_bug("NoPartialUse")
    r.prevented = "the report waits for DecodeInstallLayer: refused (NoPartialUse)"
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
