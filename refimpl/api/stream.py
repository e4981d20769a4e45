"""A streamed offer's sender side: each layer copied at ``send_layer``, sent on ready.

``Sender.send_layer(rid, layer)`` copies that layer of every sent block of every source
rank held here into one buffer per rank (the blocks' layer pieces in block order: one
message per (rank, layer), not per block; ``Sender(..., blocks_per_chunk=k)`` splits it
into runs of k blocks, as the spec's tour does with k=1: one spec chunk per block), and
hashes each block's piece into that block's seal digest (layer order) at once: what
leaves is the bytes at ``send_layer``, so the request may free or reuse its blocks as
soon as it returned (FrozenSnapshot / NoReuseUnderIO for a streamed offer, whose blocks
are not pinned). Copies of layers computed before the receiver's ready wait here (one
layer's bytes per rank and block, at most all of them) and are dropped when the attempt
ends. After the last layer, one ``seal`` per rank carries its blocks' digests.

The ``stream_reads_at_ready`` switch (``refimpl.api.switches``) is the bug this fixes: a
layer's bytes are read when they are sent, not when ``send_layer`` was called.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

from refimpl.api.wire import CHUNK, SEAL
from refimpl.checksum import byte_view, bytes_checksum
from refimpl.engine.data import RankPools
from refimpl.transport import Transport


class Buffers:
    """A Sender's host buffers for layer copies, reused: a fresh buffer costs a page fault
    per page on first touch (on this machine a fresh 256 MiB costs more than 10 copies
    of it), as an engine's registered staging memory does not. A buffer comes back only
    from an attempt the receiver acknowledged (every byte of it consumed, on any
    transport); an attempt that ended otherwise drops its buffers (a chunk may still be
    on its way). At most ``max_bytes`` are kept."""

    def __init__(self, max_bytes: int = 1 << 29) -> None:
        self.max_bytes, self.kept = max_bytes, 0
        self._free: dict[int, list[torch.Tensor]] = {}

    def take(self, nbytes: int) -> torch.Tensor:
        free = self._free.get(nbytes)
        if free:
            self.kept -= nbytes
            return free.pop()
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, bufs: Sequence[torch.Tensor]) -> None:
        for t in bufs:
            if self.kept + t.numel() <= self.max_bytes:
                self._free.setdefault(t.numel(), []).append(t)
                self.kept += t.numel()


@dataclass
class Stream:
    """Layers computed, layers sent, each (rank, block)'s digest, the copies to send."""

    layers: int
    blocks: tuple[int, ...]  # the sent blocks' ids here
    computed: int = 0  # layers [0, computed) are written and may be sent
    sent: int = 0  # layers [0, sent) are on the wire
    copied: int = 0  # layers whose bytes were copied here (at send_layer, or by the bug later)
    digests: dict[tuple[int, int], Any] = field(default_factory=dict)  # (rank, j) -> xxh3
    sealed: bool = False
    copies: deque[tuple[int, int, int, memoryview, str]] = field(default_factory=deque)  # to
    # send: (layer, rank, j, the layer of sent blocks j.. at send_layer, its xxh3), oldest first
    run: int | None = None  # sent blocks per chunk (None: every sent block in one chunk)
    buffers: Buffers = field(default_factory=Buffers)
    taken: list[torch.Tensor] = field(default_factory=list)  # from ``buffers``, this attempt

    def end(self, acked: bool) -> None:
        """The attempt ended: drop the copies not sent; their buffers go back if acked."""
        self.copies.clear()
        if acked:
            self.buffers.give(self.taken)
        self.taken.clear()

    def copy_layer(self, pools: RankPools, ranks: Sequence[tuple[int, int]], layer: int) -> None:
        """Copy layer ``layer`` of every sent block of each (source rank, pool index) into
        one buffer per rank (one gather), hashing each block's piece into its digest."""
        if not self.blocks:
            return  # nothing sent (a prefix covers every block): no chunk, only the seals
        idx = torch.as_tensor(self.blocks, dtype=torch.long)
        for r, pool in ranks:
            kv = pools.pools[pool].kv  # [capacity, layers, ...]: a layer's bytes as uint8
            raw = kv.view(kv.shape[0], kv.shape[1], -1).view(torch.uint8)  # (a fast gather)
            layer_raw = raw.select(1, layer)  # this layer only
            if kv.device.type == "cpu":
                t = self.buffers.take(len(self.blocks) * layer_raw.shape[1])
                torch.index_select(layer_raw, 0, idx, out=t.view(len(self.blocks), -1))
                self.taken.append(t)
            else:
                t = layer_raw.index_select(0, idx.to(kv.device)).cpu()
            payload = byte_view(t)  # the copy, kept until the attempt ends
            n, per = len(self.blocks), payload.nbytes // len(self.blocks)
            for j in range(n):
                h = self.digests.setdefault((r, j), xxhash.xxh3_64())
                h.update(payload[j * per : (j + 1) * per])
            run = self.run or n
            for j in range(0, n, run):
                piece = payload[j * per : min(n, j + run) * per]  # hashed while in cache
                self.copies.append((layer, r, j, piece, bytes_checksum(piece)))
        self.copied += 1

    def flush(
        self,
        transport: Transport,
        channel: str,
        head: dict[str, Any],
        first_block: int,
        ranks: Sequence[int],
        read_now: Any = None,
    ) -> tuple[int, int]:
        """Send every computed layer not sent yet, then the seals once all are out;
        returns (chunks, payload bytes) sent. ``read_now(layer)``: the bug switch's read
        of a layer at this point (None: the copies taken at send_layer)."""
        n = nbytes = 0
        while self.sent < self.computed:
            if read_now is not None:
                read_now(self.sent)
            while self.copies and self.copies[0][0] == self.sent:
                layer, r, j, payload, checksum = self.copies.popleft()
                run = min(self.run or len(self.blocks), len(self.blocks) - j)
                header = {
                    **head,
                    "type": CHUNK,
                    "block_index": first_block + j,  # the first of the chunk's ``blocks``
                    "blocks": run,
                    "rank": r,
                    "layer": layer,
                    "checksum": checksum,
                }
                transport.send(channel, header, payload)
                n, nbytes = n + 1, nbytes + payload.nbytes
            self.sent += 1
        if self.sent == self.layers and not self.sealed:
            self.sealed = True
            for r in ranks:
                digests = [self.digests[(r, j)].hexdigest() for j in range(len(self.blocks))]
                transport.send(channel, {**head, "type": SEAL, "rank": r, "digests": digests})
        return n, nbytes
