"""A worker takes a control message of its peer's dead incarnation as current.

Prefill (incarnation 0) freezes r0 and sends the Handoff, then crashes: r0 fails (no
validated copy on decode) and prefill comes back as incarnation 1 with empty pools. The
dead incarnation's Handoff is still on its way to decode, and the bug strikes: decode
takes it as the new prefill's word (NIXL's cached agent metadata of the old process, a
session id nobody checks), moves its epoch fence to an attempt the new prefill never
made and answers it with a Nack: a message of the dead incarnation changed decode's
state (Fencing). With a Ready the same bug sends a live prefill's writes to the dead
decode's registration.

The correct decode reads the incarnation a message carries: the Handoff names prefill
incarnation 0, prefill is at 1, so it is fenced: neither reserved on (``StaleError``,
Fencing) nor rejected (not enabled), only discarded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.actions import decode_args  # noqa: E402
from spec.steps import check_step  # noqa: E402

PROPERTY = "Fencing"
MUTANT = "stale_incarnation_accepted"
COVERS = ("issue #21: restarts", "NIXL: stale agent metadata after a restart")
SCENARIO = "decode acts on the Handoff of a dead prefill incarnation after prefill restarted"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    _, steps = r.model_check()
    last = steps[-1]
    pre_bug = r.engine(bug=True)
    r.run_steps(pre_bug, steps[:-1])
    pre = pre_bug.abstract()
    r.expect(pre.p_inc == 1, "prefill restarted: its incarnation is 1")
    e = r.replay_with_bug(safety=False)
    i, arg = decode_args(last["action"], last["args"])
    broken = check_step(pre, last["action"], i, arg, e.abstract(), e.config)
    r.expect(PROPERTY in broken, f"the last step breaks {PROPERTY} (a transition) {broken}")
    before, after = pre.reqs[0], e.abstract().reqs[0]
    r.expect(after.dep != before.dep, f"decode's fence moved: dep {before.dep} -> {after.dep}")
    r.damage = (
        f"{last['action']} took incarnation 0's Handoff after prefill's restart: decode's"
        f" epoch fence moved to {after.dep} for an attempt no live prefill made"
    )
    e2, _ = r.replay_without_bug(None)  # DecodeReject is not enabled (DecodeReserve: Fencing)
    waited = r.survives(e2)
    r.prevented = (
        "the Handoff names prefill incarnation 0 and prefill is at 1: decode does not act on"
        f" it, only discards it; the run ends quiescent ({len(waited.steps)} steps)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
