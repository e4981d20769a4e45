"""Slots that outlive their request: decode's metadata slot, reused by the next request.

Engines address a transfer's control data through a small slot id: SGLang's metadata
buffer index (with the bootstrap room), vLLM's NIXL notification / transfer id, a
Mooncake slot. The slot is freed when its request's decode side is freed and handed to
the next request, while a notification of the first one may still be in flight (an
abort after every chunk landed frees at once: no write can land, but a RankDone still
can). With ``Config.slots`` decode has one such slot: ``DecodeReserve`` takes it
(``Req.sl``), a reservation waits (or is rejected) while another request holds it, and
every free returns it.

A notification carries its request's room (SGLang's bootstrap room, vLLM's request
id), and decode matches it by room, never by slot alone: a late RankDone of a request
whose slot went to another request is discarded and changes nothing (``Fencing``; the
step predicate ``own_request_only`` in ``spec/steps.py``). The mutant
``slot_reused_unfenced`` resolves it by the slot id and counts it for the slot's new
holder.
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Result, take
from spec.config import Config
from spec.state import FILLING, G_STALE, M_DONE, RESERVED, World, msg_idx, msg_kind


def slot_free(w: World, c: Config) -> bool:
    """Can a new attempt take the metadata slot? Always, in a world without slots."""
    return not c.slots or all(r.sl == 0 for r in w.reqs)


def slot_taken(c: Config) -> int:
    """``Req.sl`` of a request whose decode side has just reserved."""
    return 1 if c.slots else 0


def resolve_by_slot(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The mutant's lookup: request ``i``'s late RankDone (its slot already freed) is
    resolved by the slot id alone and counted for the slot's current holder."""
    r = w.reqs[i]
    if not c.slots or "slot_reused_unfenced" not in m or msg_kind(arg) != M_DONE or r.sl:
        return NOT_ENABLED
    for j, o in enumerate(w.reqs):
        if j != i and o.sl and o.d in (RESERVED, FILLING):
            reqs = list(w.reqs)
            reqs[i] = r._replace(net=take(r.net, arg))
            reqs[j] = o._replace(rmask=o.rmask | (1 << msg_idx(arg)), g=o.g | G_STALE)
            return w._replace(reqs=tuple(reqs))
    return NOT_ENABLED


def others_unchanged(pre: World, i: int, post: World) -> bool:
    """No request but ``i`` changed (the Fencing check of a message of request ``i``:
    its room names its request; a reused slot id does not)."""
    return all(
        a is b or a == b for k, (a, b) in enumerate(zip(pre.reqs, post.reqs, strict=True)) if k != i
    )


__all__ = ["others_unchanged", "resolve_by_slot", "slot_free", "slot_taken"]
