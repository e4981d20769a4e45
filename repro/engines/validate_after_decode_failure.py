"""Decode installs and runs an attempt it has failed itself.

Decode's load of r0 fails on decode's own error (a load timeout: vLLM's connector reports
the blocks as load errors and marks the request failed; SGLang's receiver polls
KVPoll.Failed). The failure is recorded (``DecodeFail``), but a late completion still
reaches the install path: decode validates, commits and generates tokens for the attempt
it failed, so the router is told the attempt failed while decode serves it: StickyEnd.

The correct decode refuses to validate, commit or step a failed attempt. It gives the
attempt up (fenced, freed, Nack), and the router may start a new attempt.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, step  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "StickyEnd"
MUTANT = "validate_after_decode_failure"
COVERS = ("issue #21 item 3: decode-side failure, then install",)
SCENARIO = "decode fails r0's attempt on its own error, then validates, commits and steps it"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    r.expect(e.rx[0].failed, "decode recorded its own failure of the attempt")
    r.run_steps(e, [step("DecodeCommit", req=0), step("DecodeStep", req=0)])
    r.expect(e.req[0].steps == 1, f"decode generated {e.req[0].steps} token of the failed attempt")
    r.damage = (
        "decode failed r0's attempt, then installed it and generated a token from it: the "
        "attempt is reported failed and served at once"
    )

    e, err = r.replay_without_bug("StickyEnd")
    waited = r.survives(e)
    r.expect(e.req[0].steps == 0, "no token of the failed attempt")
    r.prevented = (
        f"validating the failed attempt is refused ({type(err).__name__}); decode gives it "
        f"up and the request ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
