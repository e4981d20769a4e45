"""Two writers after a timed-out handoff (seed failure 2, second half).

Prefill hands request r0 to decode. All chunks land, but prefill's timer fires before
the RankDones reach decode. The bug: prefill's timeout thaws its copy and goes on
decoding, without decode's Nack. Decode then validates and commits the same request.
Both replicas are writable at once and each side appends its own tokens: SingleWriter
breaks, and the two copies of r0's KV diverge.

In the correct protocol, a source that gives up without decode's word fails the request
and frees its copy; it never thaws. Decode's validate of the failed request is refused
(StickyEnd), so at most one side ever writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems, step  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import FAILED, WRITABLE  # noqa: E402

PROPERTY = "SingleWriter"
MUTANT = "source_resumes_on_timeout"
COVERS = ("seed 2: source and target both keep writing",)
SCENARIO = "prefill's timeout thaws r0 without a Nack; decode commits it too: two writers"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    w = e.abstract().reqs[0]
    r.expect(w.p == WRITABLE and w.d == WRITABLE, "prefill and decode both hold r0 writable")
    r.run_steps(e, [step("PrefillDecodeStep", req=0), step("DecodeStep", req=0)])
    n = diff_elems(e.replica(0, "p"), e.replica(0, "d"))
    r.expect(n > 0, f"after one decode step on each side the replicas differ in {n} elements")
    r.damage = (
        f"both sides write r0: after one token each, prefill's and decode's copies of r0's KV "
        f"differ in {n} elements"
    )

    e, err = r.replay_without_bug("StickyEnd")
    r.expect(e.req[0].status == FAILED, "prefill's timeout failed r0 and freed its copy")
    waited = r.survives(e)
    r.prevented = (
        "prefill's timeout fails r0 instead of thawing it; decode's validate is refused "
        f"(StickyEnd): never two writers; r0 ends failed ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
