"""A rejection that does not fence its epoch: a copy of the rejected Handoff reserves later.

Two requests, a decode pool that fits one. r0 holds the decode blocks; r1's Handoff
(epoch 1) is duplicated on the way. Decode rejects one copy (no room) and Nacks epoch
1, but the bug leaves its fence (``dep``) below 1. Room frees (r0's attempt times out);
the second copy of r1's Handoff now reserves, decode answers Ready(1), and prefill, which
has not yet read the Nack, takes it, sends, and decode validates and commits r1. Then
the Nack of the same epoch arrives: prefill thaws its source for writing while decode
writes its committed copy: two writers (SingleWriter). Engines: a proxy retried a
rejected decode request with the same KV-transfer metadata (vllm-ascend #13929).

The correct decode sets ``dep = 1`` when it rejects: the second copy is refused
(Fencing) and discarded; prefill resumes on the Nack and serves r1 itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import WRITABLE  # noqa: E402

PROPERTY = "SingleWriter"
MUTANT = "reject_unfenced"
COVERS = ("issue #25 item 4: a rejection that does not fence its epoch", "vllm-ascend #13929")
SCENARIO = "a duplicate of a rejected Handoff reserves; decode commits, the Nack thaws prefill"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    both = [i for i, q in enumerate(e.abstract().reqs) if q.p == WRITABLE and q.d == WRITABLE]
    r.expect(bool(both), f"a request is writable on prefill and on decode: r{both}")
    r.damage = (
        f"r{both[0] if both else '?'} was rejected for epoch 1, then reserved and committed on"
        " a copy of the same Handoff; the Nack thawed prefill's source: two writers"
    )
    e2, err = r.replay_without_bug("Fencing")
    waited = r.survives(e2)
    r.prevented = (
        f"the rejection fenced epoch 1: the copy of the Handoff is refused"
        f" ({type(err).__name__}, Fencing) and discarded; the run ends ({len(waited.steps)}"
        " steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
