"""A failed request is brought back by a later success.

Decode has validated request r0's handoff, but before it commits, prefill's timer fires:
prefill gives up, fails r0 and tells the router, which reports the failure to the client.
The bug: decode's commit does not look at the status; it commits and sets r0 running
again. The client was told r0 failed, yet decode goes on generating tokens for it:
StickyEnd breaks (failed is not final any more).

In the correct protocol failed is sticky: the commit is refused, decode aborts the
attempt and frees its blocks.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, step  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import FAILED, RUNNING  # noqa: E402

PROPERTY = "StickyEnd"
MUTANT = "error_overwritten"
COVERS = ("outline 8: an error status overwritten by a later success",)
SCENARIO = "prefill fails r0 on a timeout; decode's late commit sets it running again"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.engine(bug=True)
    r.run_steps(e, r.steps[:-1])
    r.expect(e.req[0].status == FAILED, "before the commit, r0 has failed")
    e = r.replay_with_bug()
    r.run_steps(e, [step("DecodeStep", req=0), step("DecodeStep", req=0)])
    r.expect(e.req[0].status == RUNNING, f"after the commit r0 is running: {e.describe(0)}")
    r.expect(e.req[0].steps == 2, f"decode generated {e.req[0].steps} tokens for failed r0")
    r.damage = (
        f"failed r0 is set running by the late commit; decode generates {e.req[0].steps} "
        "tokens for a request the client was told had failed"
    )

    e, err = r.replay_without_bug("StickyEnd")
    waited = r.survives(e)
    r.expect(e.req[0].status == FAILED, "r0 stays failed")
    r.prevented = (
        "the commit of failed r0 is refused (StickyEnd); decode aborts and frees "
        f"({len(waited.steps)} steps, nothing held); r0 stays failed"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
