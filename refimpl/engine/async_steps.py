"""Asynchronous steps on the reference engine (``spec/behaviours/async_steps.py``).

A dispatched step holds the block table it was launched with (``InFlight.blocks``) and
writes through it when it completes, whatever the allocator says by then: a GPU kernel
does not ask the allocator. So a free, a preemption or a freeze while a step is in
flight is real damage here: the step's write lands in blocks that another request now
holds, or in a frozen snapshot. The correct engine refuses those while a step of the
request is in flight on that worker (``inflight.step_guard``, called by the prefill and decode
actions) and lets a cancel through: its blocks are freed after the completion, which
discards the output (what vLLM's ``update_from_output`` and SGLang's
``process_batch_result`` do one step late).
"""

from __future__ import annotations

from typing import Any

from refimpl.engine.base import RX_COMMITTED
from refimpl.engine.env import EnvActions
from refimpl.engine.inflight import InFlight
from spec.state import IDLE, NONE, PREFILLING, RUNNING, WRITABLE

__all__ = ["AsyncStepActions"]


class AsyncStepActions(EnvActions):
    """The four step actions, and the crash that takes a worker's steps with it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inflight: dict[tuple[int, str], InFlight] = {}  # (request, "p"/"d") -> step

    def PrefillStepDispatch(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.config.async_steps or not self.p_up or (i, "p") in self.inflight:
            raise self._ne("PrefillStepDispatch", i)
        if self.p_status(i) != WRITABLE or r.phase != IDLE:
            raise self._ne("PrefillStepDispatch", i)
        forward = r.status == PREFILLING
        if not forward and (r.status != RUNNING or self.h_status(i) != NONE):
            raise self._ne("PrefillStepDispatch", i)
        blocks = self.p_table(i)  # logical order (the window's pruned ids first)
        slot = None if forward else self._next_slot(i)
        self.inflight[(i, "p")] = InFlight(forward, blocks, slot, r.steps)

    def PrefillStepComplete(self, req: int) -> None:
        i, r = req, self.req[req]
        s = self.inflight.get((i, "p"))
        if not self.config.async_steps or not self.p_up or s is None:
            raise self._ne("PrefillStepComplete", i)
        del self.inflight[(i, "p")]
        if s.forward:
            kv = self._compute_kv(i)
            if self.p_status(i) == WRITABLE:  # into its own blocks (an ended one: discarded)
                self.P.write_full(self.rid(i), s.blocks, kv)
                self.truth[i], r.computed = kv, True
                if r.status == PREFILLING:
                    r.status = RUNNING
            else:  # its blocks were taken from under it: the kernel writes anyway
                self.P.write_full_raw(s.blocks, kv)
            return
        self._complete_token(i, s, "p")

    def DecodeStepDispatch(self, req: int) -> None:
        i, x, r = req, self.rx[req], self.req[req]
        if not self.config.async_steps or not self.d_up or (i, "d") in self.inflight:
            raise self._ne("DecodeStepDispatch", i)
        if x.phase != RX_COMMITTED or r.status != RUNNING:
            raise self._ne("DecodeStepDispatch", i)
        logical = tuple(self.D.alloc.blocks_of(self.rid(i) + "#pfx") + x.own)
        self.inflight[(i, "d")] = InFlight(False, logical, self._next_slot(i), r.steps)

    def DecodeStepComplete(self, req: int) -> None:
        i = req
        s = self.inflight.get((i, "d"))
        if not self.config.async_steps or not self.d_up or s is None:
            raise self._ne("DecodeStepComplete", i)
        del self.inflight[(i, "d")]
        self._complete_token(i, s, "d")

    def _complete_token(self, i: int, s: InFlight, worker: str) -> None:
        """A token step's write lands through its block table: in the request's own
        writable replica (the token of an ended request is discarded, its bytes are its
        own), or, where the blocks were freed or frozen under it, wherever the table
        points."""
        pools = self.P if worker == "p" else self.D
        live = self.p_status(i) == WRITABLE if worker == "p" else self.rx[i].phase == RX_COMMITTED
        if live:
            self._append_token(i, pools, s.blocks, self.rid(i))
            return
        if s.slot is not None:
            j, slot = s.slot
            pools.write_token(None, s.blocks[j], slot, self._token_kv(i, s.token))

    def EnvCrash(self, worker: str | int) -> None:
        """A crash takes the worker's steps in flight with it."""
        super().EnvCrash(worker)
        gone = {w for w, up in (("p", self.p_up), ("d", self.d_up)) if not up}
        self.inflight = {k: v for k, v in self.inflight.items() if k[1] not in gone}

    def step_registers(self, i: int) -> tuple[int, int]:
        """The spec's ``pstep`` and ``dstep`` of request i."""
        return int((i, "p") in self.inflight), int((i, "d") in self.inflight)
