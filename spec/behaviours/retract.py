"""Retraction and refetch: decode drops a committed copy under memory pressure.

Engines: SGLang's decode scheduler retracts running requests when its KV pool is full
(``retract_decode``); without a decode-side host copy the request must be computed
again, and it is re-queued (PR 25035 re-queues through the prealloc path; PR 31905
aborts when there is no copy to resume from). vLLM preempts a running request on the
decode instance and recomputes it (vllm-ascend's ``RecomputeScheduler`` sends it back to
prefill). The model takes that path: **the refetch is a recompute on prefill and a new
handoff attempt**. ``DecodeRetract`` frees decode's committed (writable) copy and marks
the request ``preempted`` (recompute); prefill admits it again (``PrefillAdmit``), runs
it and hands it off once more under the next epoch (``PrefillFreeze``: ``ep + 1``), so
every late message of the first attempt is of an older epoch and is fenced on both
sides (decode's ``dep`` still names the retracted attempt). A source prefill still
holds when decode retracts (the Ack in flight) is freed by that Ack, as before.

Guards: the copy is committed (``d`` writable) and the request running; nothing else
reads it in this model (an in-flight model step would be a reader: see the async
behaviour); retractions count as moves (``mv``, bounded by ``max_moves``).

Bugs (``spec/mutants.py``): ``retract_loses_kv`` drops the only complete copy and
leaves the request running (NothingLost: it runs on KV that no longer exists);
``retract_keeps_epoch`` re-opens the retracted attempt's epoch for the refetch (a
reused room id): a late Ready of the first attempt is taken for the second, and prefill
writes into decode blocks the retraction freed (NoReuseUnderIO).
"""

from __future__ import annotations

from spec.actions_decode import _free
from spec.actions_env import back_to_prefill
from spec.behaviours.async_steps import step_blocks_free
from spec.common import NOT_ENABLED, Mutants, Result
from spec.config import Config
from spec.state import RUNNING, WRITABLE, Req, World

__all__ = ["DecodeRetract", "refetch_reuses_epoch"]


def DecodeRetract(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Drop decode's committed copy of a running request; it is computed again."""
    r = w.reqs[i]
    if not c.retract or not w.d_up or r.d != WRITABLE or r.st != RUNNING:
        return NOT_ENABLED
    if r.mv >= c.max_moves or r.tn:  # tn: a session pinned for its next turn
        return NOT_ENABLED
    busy = step_blocks_free(c, r, "d", m)  # a decode step in flight still writes them
    if busy is not None:
        return busy
    if "retract_loses_kv" in m:
        return _free(w, i, r._replace(mv=r.mv + 1))
    return _free(w, i, back_to_prefill(w, r._replace(mv=r.mv + 1)))  # fails: prefill down


def refetch_reuses_epoch(r: Req, m: Mutants) -> bool:
    """Does ``PrefillFreeze`` re-open the old epoch instead of ``ep + 1``? Never, but
    with the ``retract_keeps_epoch`` mutant for a request computed again after a move
    (a retraction, in the retract worlds)."""
    return "retract_keeps_epoch" in m and r.mv > 0 and r.ep > 0
