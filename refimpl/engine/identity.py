"""Content identity and metadata slots on the engine (``spec/behaviours/identity.py`` and
``spec/behaviours/slots.py``), between the decode actions and the environment's.

- ``PrefillStage``: the sender stages its frozen blocks in order; a chunk of a block not
  yet staged is refused (``IdentityError``). The ``unstaged_block_advertised`` bug sends
  the send buffer as it is (stale bytes, checksummed by the sender, so decode's per-chunk
  checksum passes); the header's ``unstaged`` mark is the engine's own bookkeeping, read
  only by the refinement map (``kind_name``: ``ChunkUnstaged``).
- ``DecodeRecyclePrefix``: the cached prefix blocks, unreferenced, are overwritten with
  another request's KV and their stored hashes reset, while the index (``prefix_blocks``)
  still lists them; a lookup then compares the hashes and misses. The
  ``prefix_hash_unchecked`` bug counts them by the index alone.
- With ``Config.slots`` decode has one metadata slot, held while a request's receiver
  holds blocks: a second reservation waits (``CapacityError``), and a late RankDone of a
  request that no longer holds it is matched by its request (its room) and dropped. The
  ``slot_reused_unfenced`` bug resolves it by the slot and counts it for the new holder.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.checksum import bytes_checksum
from refimpl.engine.base import (
    BASE_KIND,
    KIND_TO_DECODE,
    PREFIX_CACHE,
    RX_NONE,
    RX_QUARANTINED,
    RX_WAITING,
    NotEnabled,
)
from refimpl.engine.data import gen
from refimpl.engine.decode import DecodeActions
from refimpl.engine.wire import parse
from refimpl.errors import CapacityError, IdentityError, RefcountError
from refimpl.transport import Payload
from spec.state import AWAIT_READY, COMPLETE, G_STALE, RUNNING, SENDING

# The engine's message kinds gain the one only a defective sender puts on the wire.
KIND_TO_DECODE["ChunkUnstaged"] = True
BASE_KIND["ChunkUnstaged"] = "Chunk"


class IdentityActions(DecodeActions):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        n = self.config.n_reqs
        self.stg = [0] * n  # blocks the sender staged for its current attempt (``stg``)
        self.unstaged = [False] * n  # a chunk never staged landed in decode's blocks
        self.pfx_ok = True  # the cached prefix blocks hold the prefix (``pfx_ok``)

    # ------------------------------------------------------------ staging (sender)
    def PrefillStage(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.identity or not self.p_up or r.status != RUNNING:
            raise self._ne("PrefillStage", i)
        if self.p_status(i) != COMPLETE or r.phase not in (AWAIT_READY, SENDING):
            raise self._ne("PrefillStage", i)
        if self.stg[i] >= self.n:
            raise self._ne("PrefillStage", i)
        self.stg[i] += 1  # block stg's bytes are in the send buffer (r.payloads)

    def PrefillFreeze(self, req: int) -> None:
        super().PrefillFreeze(req)
        self.stg[req] = 0  # a new attempt's send buffer holds nothing yet

    def PrefillSendChunk(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.config.identity or not self.p_up or r.status != RUNNING or r.phase != SENDING:
            return super().PrefillSendChunk(req)
        per = self.n - r.phit
        rank, pos = divmod(r.sent, per + 1)
        j = r.phit + pos
        if pos >= per or j < self.stg[i]:
            return super().PrefillSendChunk(req)
        if "unstaged_block_advertised" not in self.m:
            raise IdentityError(f"r{i} block {j} is not staged ({self.stg[i]} staged)")
        true_p, true_c = r.payloads[rank][j], r.checksums[rank][j]
        stale: Payload = bytes(len(true_p))  # the buffer's old bytes, checksummed as sent
        r.payloads[rank][j], r.checksums[rank][j] = stale, bytes_checksum(stale)
        try:
            super().PrefillSendChunk(req)
        finally:
            r.payloads[rank][j], r.checksums[rank][j] = true_p, true_c

    def send(
        self, i: int, kind: str, epoch: int, idx: int = 0, payload: Payload = b"", **extra: object
    ) -> None:
        block = extra.get("block")
        if (
            kind == "Chunk"
            and self.config.identity
            and isinstance(block, int)
            and block >= self.stg[i]
        ):
            extra["unstaged"] = True  # bookkeeping for the refinement map only
        super().send(i, kind, epoch, idx, payload, **extra)

    def kind_name(self, text: str, data: Payload) -> str:
        name = super().kind_name(text, data)
        if name == "Chunk" and parse(text).get("unstaged"):
            return "ChunkUnstaged"
        return name

    def DecodeReceiveChunk(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        x = self.rx[req]
        lands = epoch == x.dep and not x.fenced and x.phase in (RX_WAITING, RX_QUARANTINED)
        super().DecodeReceiveChunk(req, msg, epoch, idx)
        if msg == "ChunkUnstaged" and lands:
            self.unstaged[req] = True

    # ------------------------------------------------------------ the prefix cache
    def DecodeRecyclePrefix(self) -> None:
        if not self.config.identity or not self.d_up or not self.prefix_blocks or not self.pfx_ok:
            raise NotEnabled("DecodeRecyclePrefix: no own prefix cached")
        refs = self.pfx_refs()
        if refs:
            raise RefcountError(f"the prefix blocks are referenced by {refs} requests")
        blocks = list(self.prefix_blocks)
        shape, dt = self.block_shape_full, self.dtype
        other = torch.stack([gen(shape, dt, self.seed, "recycled", j) for j in range(len(blocks))])
        self.D.write_full(PREFIX_CACHE, blocks, other)  # another request's KV
        self.prefix_chain = [""] * len(blocks)  # each block's stored hash is reset
        self.pfx_ok = False

    def _prefix_hit(self, tokens: tuple[int, ...]) -> int:
        if not self.pfx_ok and "prefix_hash_unchecked" in self.m:
            return len(self.prefix_blocks)  # the bug: the index's word, no hash compare
        return super()._prefix_hit(tokens)

    # ------------------------------------------------------------ the metadata slot
    def _slot_held(self) -> bool:
        return self.config.slots and any(x.phase != RX_NONE for x in self.rx)

    def DecodeReserve(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        x = self.rx[req]
        self.find(req, msg, epoch, idx)
        fresh = self.d_up and x.phase == RX_NONE and epoch > x.dep
        if fresh and self.req[req].status == RUNNING and self._slot_held():
            raise CapacityError(f"r{req}: decode's metadata slot is held")
        super().DecodeReserve(req, msg, epoch, idx)
        self.unstaged[req] = False

    def _room(self, i: int, need: int) -> bool:
        return super()._room(i, need) and not self._slot_held()

    def DecodeReceiveDone(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        late = self.config.slots and self.d_up and self.rx[req].phase == RX_NONE
        if not (late and msg == "RankDone" and "slot_reused_unfenced" in self.m):
            return super().DecodeReceiveDone(req, msg, epoch, idx)
        ch, k = self.find(req, msg, epoch, idx)
        for j, x in enumerate(self.rx):
            if j != req and x.phase == RX_WAITING:  # the slot's new holder
                self.wire.take(ch, k)
                x.rmask |= 1 << idx
                self.req[j].ghost |= G_STALE
                return None
        raise self._ne("DecodeReceiveDone", req)
