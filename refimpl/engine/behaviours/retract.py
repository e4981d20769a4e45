"""Retraction (spec ``spec/behaviours/retract.py``): decode drops its committed copy of
a running request under memory pressure; the request is computed again on prefill and
handed off under a new epoch (``PrefillFreeze``: ``PrefillActions._next_epoch``)."""

from __future__ import annotations

from refimpl.engine.base import RX_COMMITTED
from refimpl.engine.env import EnvActions
from refimpl.engine.inflight import step_guard
from spec.state import PREEMPTED, RUNNING

__all__ = ["RetractActions"]


class RetractActions(EnvActions):
    def DecodeRetract(self, req: int) -> None:
        """Free decode's committed blocks; the request is marked for recompute. The
        ``retract_loses_kv`` bug leaves it running on the KV it just freed."""
        i, x, r = req, self.rx[req], self.req[req]
        if not self.config.retract or not self.d_up or x.phase != RX_COMMITTED:
            raise self._ne("DecodeRetract", i)
        if r.status != RUNNING or r.moves >= self.config.max_moves:
            raise self._ne("DecodeRetract", i)
        step_guard(self, i, "d", "free")  # a decode step in flight still writes the blocks
        if "retract_loses_kv" not in self.m:
            r.status = PREEMPTED
        r.moves += 1
        self._free_rx(i)  # the blocks go back to decode's pool, the prefix reference too
