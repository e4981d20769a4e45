"""Streamed offers (spec ``spec/stream/layers.py``): a handoff sent layer by layer.

Prefill: ``PrefillSendLayer`` copies the next layer of every frozen block of every rank
at once (bytes for the wire, a tensor for the replica check): those copies are what the
chunks carry, so ``PrefillFreeSource`` may give the request's blocks back to the pool
(its pin and its own reference) while the handoff goes on; the replica ``p`` is then
the copies. The ``stream_reads_at_ready`` bug takes no copy: a chunk reads the blocks
when it is sent (the frozen snapshot's byte views), whoever holds them by then.

Decode: a chunk lands in a staging copy of the request's blocks, not in the blocks the
engine reads; ``DecodeInstallLayer`` copies the next layer from staging into them, and
``DecodeLayerReady`` reports only an installed layer (the ``layer_ready_on_staging`` bug
reports one that is only in staging). Validation waits for every layer installed.
Every action refuses with ``NotEnabled`` in a world without layers.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.chunks import pin_name
from refimpl.engine.env import EnvActions
from refimpl.errors import IncompleteError
from spec.state import (
    AWAIT_READY,
    COMPLETE,
    FAILED,
    FILLING,
    G_END_FAILED,
    IDLE,
    RUNNING,
    SENDING,
    WRITABLE,
)

__all__ = ["StreamActions"]

_LANDING = (FILLING, COMPLETE, WRITABLE)  # FILLING, validated, committed: the chunks are in


class StreamActions(EnvActions):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        n = self.config.n_reqs
        self.lay = [0] * n  # layers given to the sender (``lay``)
        self.copies: list[list[tuple[list[list[bytes]], torch.Tensor]]] = [[] for _ in range(n)]
        self.fs = [False] * n  # the source blocks went back to the pool (``fs``)
        self.staging: list[torch.Tensor | None] = [None] * n  # decode's staging copy
        self.inl = [0] * n  # layers installed in the blocks the engine reads (``inl``)
        self.rdy = [0] * n  # layers reported ready (``rdy``)

    def _span(self, layer: int) -> tuple[int, int]:
        """The engine's layers [lo, hi) that spec layer ``layer`` stands for."""
        nl, k = self.p_geo.num_layers, self.config.layers
        return layer * nl // k, (layer + 1) * nl // k

    # ------------------------------------------------------------ prefill
    def PrefillSendLayer(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.layers or not self.p_up or r.status != RUNNING or self.p_status(i) != COMPLETE:
            raise self._ne("PrefillSendLayer", i)
        if r.phase not in (AWAIT_READY, SENDING) or self.lay[i] >= c.layers:
            raise self._ne("PrefillSendLayer", i)
        layer, self.lay[i] = self.lay[i], self.lay[i] + 1
        if "stream_reads_at_ready" in self.m:  # the bug: no copy, read when sent
            return
        lo, hi = self._span(layer)
        blocks = self.P.alloc.blocks_of(pin_name(self.rid(i), r.epoch))
        nl = self.p_geo.num_layers
        wire = []
        for k in range(self.P.tp):
            rank = []
            for b in blocks:
                raw = bytes(self.P.shard_bytes(k, b))
                per = len(raw) // nl
                rank.append(raw[lo * per : hi * per])
            wire.append(rank)
        self.copies[i].append((wire, self.P.gather(blocks)[:, lo:hi].clone()))

    def PrefillFreeSource(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.layers or not self.p_up or r.status != RUNNING or self.p_status(i) != COMPLETE:
            raise self._ne("PrefillFreeSource", i)
        if r.phase == IDLE or self.fs[i] or self.lay[i] < c.layers:
            raise self._ne("PrefillFreeSource", i)
        rid = self.rid(i)
        self.P.alloc.free(pin_name(rid, r.epoch))
        self.P.alloc.free(rid)
        self.fs[i] = True

    def p_status(self, i: int) -> int:
        """A streamed offer that gave its blocks back: its copies are the replica."""
        if self.streamed_out(i):
            return COMPLETE
        return super().p_status(i)

    def streamed_out(self, i: int) -> bool:
        """Is request i's prefill replica the sender's copies (its blocks given back)?"""
        return self.fs[i] and self.req[i].phase != IDLE

    def stream_copies(self, i: int) -> torch.Tensor | None:
        """The replica the copies make, [n, layers, 2, H, bs, D] (None: a layer uncopied)."""
        parts = [t for _, t in self.copies[i]]
        return torch.cat(parts, dim=1) if len(parts) == self.config.layers else None

    def PrefillSendChunk(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if c.layers and self.lay[i] < c.layers:  # a chunk leaves once its layers are known
            raise self._ne("PrefillSendChunk", i)
        sending = self.p_up and r.status == RUNNING and r.phase == SENDING  # else it refuses
        if sending and c.layers and len(self.copies[i]) == c.layers and r.payloads:
            r.payloads = [  # the bytes copied at send_layer, layer order
                [b"".join(cp[0][k][j] for cp in self.copies[i]) for j in range(len(rank))]
                for k, rank in enumerate(r.payloads)
            ]
        super().PrefillSendChunk(req)

    def PrefillResume(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """A Nack to an offer whose source is gone: nothing to thaw, it fails closed."""
        i, r = req, self.req[req]
        if not self.fs[i]:
            super().PrefillResume(req, msg, epoch, idx)
            return
        super().PrefillResume(req, msg, epoch, idx)  # consumes the Nack, unpins nothing
        r.status, r.ghost = FAILED, r.ghost | G_END_FAILED

    # ------------------------------------------------------------ decode
    def DecodeReceiveChunk(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """In a streamed world a chunk lands in staging: the blocks keep their bytes."""
        i, x = req, self.rx[req]
        if not self.config.layers or not x.own:
            super().DecodeReceiveChunk(req, msg, epoch, idx)
            return
        own = x.own
        real = self.D.gather(own)
        staged = self.staging[i]
        if staged is not None:
            self.D.write_full_raw(own, staged)
        try:
            super().DecodeReceiveChunk(req, msg, epoch, idx)
            if x.own == own:
                self.staging[i] = self.D.gather(own)
        finally:
            self.D.write_full_raw(own, real)

    def _staged_layers(self, i: int) -> int:
        x = self.rx[i]
        if self.d_status(i) not in _LANDING or x.corrupt or x.manifest is None:
            return 0
        return self.config.layers if x.landed == self._full_chunks(i) else 0

    def DecodeInstallLayer(self, req: int) -> None:
        i, x = req, self.rx[req]
        if not self.config.layers or not self.d_up or self.inl[i] >= self._staged_layers(i):
            raise self._ne("DecodeInstallLayer", i)
        staged = self.staging[i]
        if x.own:
            assert staged is not None
            lo, hi = self._span(self.inl[i])
            real = self.D.gather(x.own)
            real[:, lo:hi] = staged[:, lo:hi]
            self.D.write_full_raw(x.own, real)
        self.inl[i] += 1

    def DecodeLayerReady(self, req: int) -> None:
        i = req
        if not self.config.layers or not self.d_up or self.rdy[i] >= self._staged_layers(i):
            raise self._ne("DecodeLayerReady", i)
        if self.rdy[i] >= self.inl[i] and "layer_ready_on_staging" not in self.m:
            raise IncompleteError(f"r{i} layer {self.rdy[i]} is only in staging")
        self.rdy[i] += 1

    def _check_end_to_end(self, i: int) -> None:
        if self.config.layers and self.inl[i] < self.config.layers:
            raise IncompleteError(f"r{i}: {self.inl[i]} of {self.config.layers} layers installed")
        super()._check_end_to_end(i)
