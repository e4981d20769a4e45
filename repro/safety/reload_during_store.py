"""A load starts while a store of the same request is in flight (incident 4: vllm #46240).

Request r0 is being offloaded: a store job copies its GPU blocks to host. Before the
store commits, the scheduler wants r0 back and starts a reload. The bug: the reload
accepts the host copy although its store has not committed. Now a load and a store of
one request are in flight at once, in opposite directions over the same blocks (in
vLLM #46240 their two completions then arrive in one step, and the second handler
crashes on a request the first one freed). The reload copies the host blocks the store
has not written yet over the GPU blocks the store is still reading, and r0's only
complete copy is gone: LoadXorStore breaks.

The correct protocol allows one direction at a time per request: the reload is refused
until the store has committed, then it loads the committed copy. (That a completion
seen twice is handled once is shown by duplicate_rank_counted.)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result, diff_elems, step  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.state import FILLING  # noqa: E402

PROPERTY = "LoadXorStore"
MUTANT = "reload_during_store"
COVERS = ("incident 4: vllm #46240",)
SCENARIO = "a reload of r0 starts mid-store and overwrites the blocks the store reads"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    w = e.abstract().reqs[0]
    r.expect(w.p == FILLING and w.h == FILLING, "a load and a store of r0 are both in flight")
    r.run_steps(e, [step("PrefillReloadCopy", req=0)] * 2)
    rep = e.replica(0, "p")
    n = diff_elems(rep, e.frozen_truth[0])
    size = rep.numel() if rep is not None else 0
    r.expect(n > 0, f"the store's source blocks now differ from r0's KV in {n} of {size}")
    h = e.abstract().reqs[0].h
    r.expect(h == FILLING, "and the host copy has not committed: no complete copy is left")
    r.damage = (
        f"the reload copied unstored host blocks over the GPU blocks the store reads: "
        f"{n} of {size} elements of r0's only complete copy destroyed"
    )

    e, err = r.replay_without_bug("LoadXorStore")
    waited = r.survives(e)
    r.prevented = (
        f"the reload is refused while the store is in flight ({type(err).__name__}, "
        f"LoadXorStore); store commits, reload is exact ({len(waited.steps)} steps, nothing held)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
