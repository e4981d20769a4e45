"""Recompute preemption on the API (``Config.recompute``): a mixin of ``ApiSubject``.

Preemption is the engine's scheduler's decision, not an API call: the scheduler drops a
running request's device blocks on purpose and queues it to be prefilled again. What the
API decides is whether those blocks may go: a transfer that reads them pins them
(``Sender.held()``: an offload's Sender, ``refimpl.api.offload.begin_offload``, holds its
source blocks until the host committed), and the scheduler must not free blocks a store
still reads (the spec's ``PrefillPreempt`` refuses ``NoReuseUnderIO`` while ``h`` is
FILLING). The scheduler reads the pins from the API, as an engine author's would:

    PrefillPreempt   the request's blocks freed on every rank (``alloc.free``), the
                     request PREEMPTED, one move counted (the spec's ``mv``); refused
                     ``NoReuseUnderIO`` while an offload's Sender pins them, not enabled
                     while a handoff attempt or a reload holds the request
    PrefillAdmit     from PREEMPTED too (``ApiActions._PrefillAdmit``): new blocks, the
                     KV computed again by ``PrefillRun``
"""

from __future__ import annotations

from typing import Any

from refimpl.engine.data import RankPools
from refimpl.errors import OwnershipError
from spec.config import Config
from spec.state import PREEMPTED, RUNNING

__all__ = ["RecomputeActions"]


class RecomputeActions:
    """The preemption action; the state is ``ApiSubject``'s."""

    c: Config
    pp: list[RankPools]
    hp: list[RankPools]
    st: list[int]
    mv: list[int]
    moves: list[Any]
    p_up: bool
    rid: Any
    _need: Any
    _live: Any
    move_of: Any

    def pinned_by_move(self, i: int) -> tuple[int, ...]:
        """The device blocks of request i that a move's Sender pins (an offload reads them)."""
        h = self.move_of(i, "offload")  # a reload's Sender pins host blocks, not these
        return h.sender.held().get(self.rid(i), ()) if h is not None else ()

    def _PrefillPreempt(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        ok = self.c.recompute and self.p_up and self.st[i] == RUNNING
        self._need(ok and self.mv[i] < self.c.max_moves, "not preemptible")
        self._need(not self._live(i), "a handoff attempt holds it")
        if pinned := self.pinned_by_move(i):
            raise OwnershipError(
                f"{rid}: blocks {list(pinned)} are pinned by a store in flight",
                prop="NoReuseUnderIO",
            )
        self._need(self.moves[i] is None, "a move holds it")
        self._need(bool(self.pp[0].alloc.blocks_of(rid)), "no device copy")
        self._need(not (self.hp and self.hp[0].alloc.blocks_of(rid)), "a host copy")
        for p in self.pp:
            p.alloc.free(rid)
        self.st[i] = PREEMPTED
        self.mv[i] += 1
