"""Sliding-window pruning (spec ``spec/window``): a running request frees the oldest
block of its prefill copy once the block left the attention window.

What vLLM's ``SlidingWindowManager.remove_skipped_blocks`` does: the request's block
table keeps its logical order (``ReqState.window`` holds the pruned ids, the table's
null entries; ``CopyBase.p_table``), the block itself goes back to the pool at once and
the request keeps running on its window (its tokens go to the window's blocks:
``EngineBase._next_slot``). A prune frees blocks, so it waits for a prefill step in
flight (``step_guard``: the step writes through the table it was dispatched with), and
a frozen copy that a transfer still reads (an offload store, a host-cache store, a
handoff that has still to send or a chunk of it in flight) is never pruned: refused
``NoReuseUnderIO``. The ``window_prunes_under_io`` bug frees the block anyway, from
the request's table and from the pins of the transfer reading it, so the pool hands it
to the next request while the store or the chunks still read it.

A pruned copy is never frozen for a handoff, an offload or a host-cache store (the
spec's transfers move whole copies: those actions refuse ``NotEnabled``); a copy given
blocks anew (``PrefillAdmit``, ``HostLoadBegin``) starts whole.
"""

from __future__ import annotations

from refimpl.chunks import pin_name
from refimpl.engine.env import EnvActions
from refimpl.engine.inflight import step_guard
from refimpl.errors import InUseError
from spec.state import AWAIT_READY, COMPLETE, IDLE, RUNNING, SENDING, WRITABLE

__all__ = ["WindowActions"]


class WindowActions(EnvActions):
    def PrefillPruneWindow(self, req: int) -> None:
        """Free the oldest block of request ``req``'s prefill copy out of its window."""
        i, r = req, self.req[req]
        if not self.config.window or not self.p_up or r.status != RUNNING:
            raise self._ne("PrefillPruneWindow", i)
        if len(r.window) + 1 >= self.n:  # the window keeps its newest block
            raise self._ne("PrefillPruneWindow", i)
        if self.p_status(i) == WRITABLE and r.phase == IDLE:
            step_guard(self, i, "p", "free")  # a step in flight still reads the window
            self._prune(i, (self.rid(i),))
            return
        if not self._window_read(i):
            raise self._ne("PrefillPruneWindow", i)
        if "window_prunes_under_io" not in self.m:
            raise InUseError(f"a store or a handoff of r{i} still reads its blocks")
        rid = self.rid(i)  # the bug: the block goes back although the transfer reads it
        self._prune(i, (rid, rid + "@store", pin_name(rid, r.epoch)))

    def _window_read(self, i: int) -> bool:
        """Does a transfer still read request i's frozen prefill copy: a store (an offload
        or a host-cache store pins it as ``r<i>@store``), a handoff that has still to send,
        or a chunk of its attempt in flight?"""
        r = self.req[i]
        if self.p_status(i) != COMPLETE:
            return False
        if self.P.alloc.blocks_of(self.rid(i) + "@store"):
            return True
        return r.phase in (AWAIT_READY, SENDING) or self._chunks_in_flight(i, r.epoch)

    def _prune(self, i: int, holders: tuple[str, ...]) -> None:
        """Drop ``holders``' references to the oldest block of the window: it is freed."""
        a, r = self.P.alloc, self.req[i]
        b = a.blocks_of(self.rid(i))[0]
        for h in holders:
            if b in a.blocks_of(h):
                a.decref(h, [b])
        r.window.append(b)
