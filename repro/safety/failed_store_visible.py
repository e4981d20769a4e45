"""A failed store stays visible to lookups (incident 5: LMCache #4991).

Request r0 is offloaded: a store job copies its GPU blocks to a host tier. The store
fails before any block is copied, and the bug only logs it: the half-written host copy
is published as if it had committed, and the GPU copy is dropped. When r0 is reloaded,
it loads the unwritten host blocks and decodes from garbage: PublishAfterCommit breaks.

In the correct protocol a host copy becomes visible only when its store commits. A
failed store is removed, never published, and the GPU copy (pinned while the store
read it) is still there: r0 goes on from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems, step  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import NONE, WRITABLE  # noqa: E402

PROPERTY = "PublishAfterCommit"
MUTANT = "failed_store_visible"
COVERS = ("incident 5: LMCache #4991",)
SCENARIO = "r0's store fails but its half-written host copy is published; the reload is garbage"
RELOAD = ("PrefillReloadBegin", "PrefillReloadCopy", "PrefillReloadCopy", "PrefillReloadCommit")


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    r.expect(e.damaged() == ["r0@h"], f"the published host copy is not r0's KV {e.damaged()}")
    r.run_steps(e, [step(a, req=0) for a in RELOAD])
    rep = e.replica(0, "p")
    n = diff_elems(rep, e.truth[0])
    size = rep.numel() if rep is not None else 0
    r.expect(e.damaged() == ["r0@p"] and n > 0, f"reloaded r0 differs in {n} of {size} elements")
    r.damage = (
        f"the failed store's host copy was published; reloading it gives r0 a GPU copy with "
        f"{n} of {size} elements wrong (never stored)"
    )

    e, _ = r.replay_without_bug(None)
    w = e.abstract().reqs[0]
    r.expect((w.h, w.p) == (NONE, WRITABLE), "the failed copy is gone; r0's GPU copy is writable")
    waited = r.survives(e)
    r.prevented = (
        "the failed store is dropped, never published; r0 goes on from its intact GPU copy "
        f"and ends ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
