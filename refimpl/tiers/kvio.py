"""The bytes of a tier's chunk files, between a worker's pools and the files.

A chunk file holds canonical blocks (every head, heads_major, the writer's block size):
``[blocks, layers, fields, heads, block_size, head_dim]``, the manifest's checksums one
per block. Both directions touch each byte once in memory and hash it once:

- out (``chunk_data``): when the pools are canonical and on the CPU, a block of the pool
  *is* a file block: its bytes are hashed and written where they lie (no copy). Otherwise
  (TP ranks, another layout, CUDA) the chunk's blocks are gathered into a staging buffer
  the caller reuses, hashed there, and written from it.
- in (``read_chunk``): when the pools are canonical on the CPU and the block sizes agree,
  each file block is read straight into its destination block and hashed there, while it
  is hot. Otherwise the chunk is read into a reused staging buffer, verified, then copied
  into the destination blocks (per TP rank, layout and block size: one copy).

A block that does not hash to its checksum stops the read (``TornFileError``); the
caller owns the destination blocks and gives them back (nothing is installed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import BinaryIO

import torch

from refimpl.checksum import block_checksum, byte_view, bytes_checksum
from refimpl.engine.data import RankPools
from refimpl.tiers.files import Header, Stopped, TornFileError, read_into

TENSOR = "kv"

__all__ = ["TENSOR", "Staging", "chunk_data", "direct", "read_chunk"]


class Staging:
    """Reusable CPU buffers of canonical blocks, one per (shape, dtype) in use at a time:
    ``take`` hands a free one (or makes one), ``give`` returns it. Thread-safe, so
    concurrent transfers never share a buffer and none is allocated per call."""

    def __init__(self) -> None:
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        key = (tuple(shape), dtype)
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return torch.empty(key[0], dtype=dtype)

    def give(self, t: torch.Tensor) -> None:
        with self._lock:
            self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)


def direct(pools: RankPools, block_size: int) -> bool:
    """A block of ``pools`` is byte for byte a file block of ``block_size`` tokens."""
    return (
        pools.canonical and pools.device.type == "cpu" and pools.geometry.block_size == block_size
    )


def _canonical_shape(pools: RankPools, n: int, block_size: int) -> tuple[int, ...]:
    g = pools.geometry
    return (n, g.num_layers, g.num_fields, pools.kv_heads, block_size, g.head_dim)


def chunk_data(
    pools: RankPools, blocks: Sequence[int], staging: torch.Tensor | None
) -> tuple[list[memoryview], list[str]]:
    """The file bytes of ``blocks`` (canonical, in order) and each block's checksum.
    ``staging``: a buffer of ``len(blocks)`` canonical blocks when not ``direct``."""
    if staging is None:
        kv = pools.pools[0].kv
        views = [byte_view(kv[b]) for b in blocks]
        return views, [bytes_checksum(v) for v in views]
    perm = _to_hm(pools)
    for r in pools.primaries:
        h = pools.heads[r]
        for k, b, n in _runs(blocks):  # one strided copy per run: per block is 10x slower
            staging[k : k + n, :, :, h.start : h.stop].copy_(
                pools.pools[r].kv[b : b + n].permute(perm)
            )
    views = [byte_view(staging[k]) for k in range(len(blocks))]
    return views, [bytes_checksum(v) for v in views]


def read_chunk(
    f: BinaryIO,
    header: Header,
    checksums: Sequence[str],
    num_tokens: int,
    file_block_size: int,
    pools: RankPools,
    blocks: Sequence[int],
    staging: Staging,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Read one chunk file (``num_tokens`` tokens in ``len(checksums)`` blocks of
    ``file_block_size``) into ``blocks`` of ``pools`` (the destination's own blocks for
    these tokens); every file block is verified. Returns the blocks verified."""
    size = header.entries[TENSOR].end - header.entries[TENSOR].begin
    nbytes = size // max(1, len(checksums))
    if direct(pools, file_block_size):
        kv = pools.pools[0].kv
        for i, b in enumerate(blocks):
            _stop(stop)
            read_into(f, header, TENSOR, kv[b], offset=i * nbytes)
            _verify(kv[b], checksums[i], i)
        return len(blocks)
    shape = _canonical_shape(pools, len(checksums), file_block_size)
    buf = staging.take(shape, pools.geometry.dtype)
    try:
        for i in range(len(checksums)):
            _stop(stop)
            read_into(f, header, TENSOR, buf[i], offset=i * nbytes)
            _verify(buf[i], checksums[i], i)
        _install(pools, blocks, buf, num_tokens)
    finally:
        staging.give(buf)
    return len(checksums)


def _stop(stop: Callable[[], bool] | None) -> None:
    if stop is not None and stop():
        raise Stopped("cancelled")


def _verify(t: torch.Tensor, want: str, i: int) -> None:
    if (got := block_checksum(t)) != want:
        raise TornFileError(f"block {i}: bytes hash to {got}, the manifest says {want}")


def _install(pools: RankPools, blocks: Sequence[int], buf: torch.Tensor, n: int) -> None:
    """Copy verified canonical blocks ``buf`` (``n`` tokens) into ``blocks`` of ``pools``
    (its TP ranks, layout and block size)."""
    bs = pools.geometry.block_size
    if buf.shape[4] != bs:  # another block size: through per-token order, one copy
        nb, layers, fields, heads, fbs, dim = buf.shape
        tok = buf.permute(1, 2, 3, 0, 4, 5).reshape(layers, fields, heads, nb * fbs, dim)
        out = torch.zeros((layers, fields, heads, len(blocks) * bs, dim), dtype=buf.dtype)
        m = min(n, len(blocks) * bs)
        out[:, :, :, :m] = tok[:, :, :, :m]
        buf = out.view(layers, fields, heads, len(blocks), bs, dim).permute(3, 0, 1, 2, 4, 5)
    perm = _to_hm(pools)
    for r in range(pools.tp):
        h = pools.heads[r]
        for k, b, n in _runs(blocks):
            pools.pools[r].kv[b : b + n].permute(perm).copy_(buf[k : k + n, :, :, h.start : h.stop])


def _to_hm(pools: RankPools) -> tuple[int, ...]:
    """The permutation of ``kv[b:b+n]`` (a run of blocks) to heads_major."""
    return (0, *(p + 1 for p in pools.to_hm))


def _runs(blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(index, first block, length)`` of each run of consecutive block ids."""
    out: list[tuple[int, int, int]] = []
    for k, b in enumerate(blocks):
        if out and out[-1][1] + out[-1][2] == b:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((k, b, 1))
    return out
