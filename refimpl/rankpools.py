"""One worker's KV pools, one per TP rank, sharing one block table (``RankPools``).

Every pool keeps one TP rank's heads; the ranks of one worker share one block table
(one ``BlockAllocator``), as TP workers do in vLLM. Shapes (H = all KV heads):

    rank pool kv    [capacity, layers, 2, H/tp, block_size, head_dim]   heads_major
                    [capacity, layers, 2, block_size, H/tp, head_dim]   tokens_major
    full replica    [n, layers, 2, H, block_size, head_dim]             heads_major
    token KV        [layers, 2, H, head_dim]                             one slot
    chunk payload   bytes of one source rank's block, in the sender's layout

Head placement comes from ``spec.shardmap`` (``tp_heads``); axis orders from
``spec.shardmap.layout_permutation``. Used by the API (``refimpl.api``), the memory and
tier modules, and the reference engine (``refimpl.engine``) alike; nothing here decides
protocol questions (landing a chunk is ``refimpl.api.layers.land_shard``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import xxhash

from refimpl.blocks import BlockAllocator
from refimpl.checksum import Buffer, block_checksum, byte_view
from refimpl.memory.interface import BlockMemory
from refimpl.pool import KVPool, PoolGeometry
from spec import shardmap as sm

__all__ = ["HEADS_MAJOR", "RankPools"]

HEADS_MAJOR = "heads_major"


class RankPools:
    """One worker's (or tier's) pools, one per TP rank, sharing one block table.

    ``memory``: the ranks' memories when not kvown's own pools (an engine's registered
    caches, ``refimpl.memory.register_kv_caches``); ``table``: the block table's class."""

    def __init__(
        self,
        tp: int,
        kv_heads: int,
        geometry: PoolGeometry,
        capacity: int,
        *,
        host: bool = False,
        device: str | None = None,
        disabled_guards: Iterable[str] = (),
        memory: Sequence[BlockMemory] | None = None,
        table: type[BlockAllocator] = BlockAllocator,
    ) -> None:
        self.tp, self.kv_heads, self.geometry = tp, kv_heads, geometry
        self.guards, self._table = frozenset(disabled_guards), table
        self.heads = [sm.tp_heads(kv_heads, tp, r) for r in range(tp)]
        self.primaries = [r for r in range(tp) if sm.tp_is_primary(kv_heads, tp, r)]
        self.pools: list[BlockMemory] = list(memory or ())
        for _ in range(tp if memory is None else 0):
            pool: BlockMemory
            if device is not None:
                pool = KVPool(capacity, geometry, device=device, pin_memory=False)
            elif host:
                pool = KVPool.host_pool(capacity, geometry)
            else:
                pool = KVPool.device_pool(capacity, geometry)
            self.pools.append(pool)
        self.reset()
        # to_hm: a block of this layout -> heads_major (for a stacked [n, ...] tensor: +1)
        self.to_hm = sm.layout_permutation(geometry.layout, HEADS_MAJOR)

    def reset(self) -> None:
        """Forget every block (a crash): one fresh allocator, zeroed memory (kvown's own;
        an engine's registered memory is left as it is)."""
        self.alloc = self._table(self.pools[0].capacity, disabled_guards=self.guards)
        for pool in self.pools:
            pool.allocator = self.alloc  # one block table for all TP ranks
            pool.clear()

    @property
    def canonical(self) -> bool:
        """One rank holding every head, heads_major: a block is already a full block."""
        return self.tp == 1 and self.geometry.layout == HEADS_MAJOR

    @property
    def device(self) -> torch.device:
        return self.pools[0].device

    def hm_block(self, rank: int, b: int) -> torch.Tensor:
        """View of block ``b`` on ``rank`` as heads_major [layers, 2, h, bs, head_dim]."""
        return self.pools[rank].kv[b].permute(self.to_hm)

    def hm_layer(self, rank: int, layer: int, b: int) -> torch.Tensor:
        """View of layer ``layer`` of block ``b`` on ``rank``: [2, h, bs, head_dim]."""
        return self.pools[rank].layer(layer)[b].permute([p - 1 for p in self.to_hm[1:]])

    def gather(self, block_ids: Sequence[int]) -> torch.Tensor:
        """A copy of the full replica: [n, layers, 2, H, bs, head_dim] on CPU."""
        g = self.geometry
        out = torch.empty(
            (len(block_ids), g.num_layers, g.num_fields, self.kv_heads, g.block_size, g.head_dim),
            dtype=g.dtype,
        )
        if not block_ids:
            return out
        perm = (0, *(p + 1 for p in self.to_hm))
        for r in self.primaries:
            h = self.heads[r]
            if self.device.type != "cpu":  # one batched read, one D2H copy
                out[:, :, :, h.start : h.stop] = (
                    self.pools[r].read_blocks(block_ids).permute(perm).cpu()
                )
                continue
            for k, b in enumerate(block_ids):  # straight from the views: one copy
                for li in range(g.num_layers):
                    out[k, li, :, h.start : h.stop].copy_(self.hm_layer(r, li, b))
        return out

    def block_checksum(self, b: int) -> str:
        """xxh3 of block ``b`` as one full heads_major block (the manifest's checksum)."""
        return self.checksums([b])[0]

    def checksums(self, block_ids: Sequence[int]) -> list[str]:
        """The manifest's checksum of each block: xxh3 of the full heads_major block,
        hashed in place when one rank already holds it in that layout, else layer by
        layer on CPU (xxh3 streams: the same digest) through one reused buffer of a
        layer of the blocks, gathered in one copy per layer and rank (no fresh copy of
        whole blocks: a fresh buffer's first touch costs more than the copy)."""
        if self.canonical and self.device.type == "cpu":
            return [block_checksum(self.pools[0].block(b)) for b in block_ids]
        if self.device.type != "cpu" or not block_ids:
            return [block_checksum(full) for full in self.gather(block_ids)]
        g, n = self.geometry, len(block_ids)
        buf = torch.empty((n, g.num_fields, self.kv_heads, g.block_size, g.head_dim), dtype=g.dtype)
        raw, per = byte_view(buf), buf[0].numel() * buf.element_size()
        idx = torch.as_tensor(list(block_ids), dtype=torch.long)
        hashes = [xxhash.xxh3_64() for _ in block_ids]
        for li in range(g.num_layers):
            for r in self.primaries:
                hs, lv = self.heads[r], self.pools[r].layer(li).permute(self.to_hm)
                if len(self.primaries) == 1:
                    torch.index_select(lv, 0, idx, out=buf)
                else:
                    buf[:, :, hs.start : hs.stop] = lv.index_select(0, idx)
            for k, h in enumerate(hashes):
                h.update(raw[k * per : (k + 1) * per])
        return [h.hexdigest() for h in hashes]

    def write_full(self, holder: str, block_ids: Sequence[int], full: torch.Tensor) -> None:
        """Write a full replica ``[n, layers, 2, H, bs, D]`` into the ranks (checked first)."""
        self.alloc.check_write(holder, block_ids)
        self.write_full_raw(block_ids, full)

    def write_full_raw(self, block_ids: Sequence[int], full: torch.Tensor) -> None:
        for r in range(self.tp):
            h = self.heads[r]
            for k, b in enumerate(block_ids):
                for li in range(self.geometry.num_layers):
                    self.hm_layer(r, li, b).copy_(full[k, li, :, h.start : h.stop])

    def write_token(self, holder: str | None, b: int, slot: int, tok: torch.Tensor) -> None:
        """Write one slot's KV ``[layers, 2, H, D]`` into block ``b`` of every rank.

        ``holder`` None writes without asking the allocator (only a mutant does that).
        """
        if holder is not None:
            self.alloc.check_write(holder, [b])
        for r in range(self.tp):
            h = self.heads[r]
            for li in range(self.geometry.num_layers):
                self.hm_layer(r, li, b)[:, :, slot].copy_(tok[li, :, h.start : h.stop])

    def shard_bytes(self, rank: int, b: int) -> Buffer:
        """Bytes of block ``b`` on ``rank`` (zero-copy on CPU, staged on CUDA)."""
        return self.pools[rank].host_bytes([b])[0]
