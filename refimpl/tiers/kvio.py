"""The bytes of a tier's chunk files, between a worker's pools and the files.

A chunk file holds canonical blocks (every head, heads_major, the writer's block size):
``[blocks, layers, fields, heads, block_size, head_dim]``, the manifest's checksums one
per block. Both directions touch each byte once in memory and hash it once:

- out (``chunk_data``): when the pools are canonical (tp=1 heads_major) and on the CPU,
  a block of the pool *is* a file block: its bytes are hashed and written where they lie
  (no copy), as one range or, in an engine's registered caches, as contiguous pieces
  (each layer's, or each field's of each layer: ``block_views``). Otherwise (TP ranks,
  another layout, a strided piece, CUDA) the chunk's blocks are gathered into a staging
  buffer the caller reuses (per run of block ids, and per layer where the layers are
  separate tensors), hashed there, and written from it.
- in (``read_chunk``): when the pools are canonical on the CPU and the block sizes agree,
  each file block is read straight into its destination block's pieces (one ``preadv``)
  and hashed there, while it is hot. Otherwise the chunk is read into a reused staging
  buffer, verified, then copied into the destination blocks (per TP rank, layout and
  block size: one copy).

A block that does not hash to its checksum stops the read (``TornFileError``); the
caller owns the destination blocks and gives them back (nothing is installed).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from typing import BinaryIO

import torch

from refimpl.checksum import (
    byte_view,
    bytes_checksum,
    hasher,
    writable_byte_view,
)
from refimpl.engine.data import RankPools
from refimpl.memory.interface import BlockMemory
from refimpl.tiers.files import Header, Stopped, TornFileError

TENSOR = "kv"
IOV_MAX = 1024  # buffers per preadv (POSIX's minimum IOV_MAX is 16; Linux's is 1024)

__all__ = [
    "TENSOR",
    "Staging",
    "block_views",
    "checksum",
    "chunk_data",
    "direct",
    "land_chunk",
    "read_chunk",
    "read_into",
]


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


def _kv(mem: BlockMemory) -> torch.Tensor | None:
    """Every block of ``mem`` as one tensor, or None where its layers are separate
    tensors (an engine's per-layer caches)."""
    try:
        return mem.kv
    except TypeError:
        return None


BlockViews = Callable[[int], list[memoryview]]


def _span(t: torch.Tensor) -> tuple[memoryview, int, int]:
    """``t`` ``[capacity, ...]`` (each block's piece contiguous, blocks evenly apart) as
    one writable byte view from block 0's piece to the last one's, the byte step from a
    block to the next, and a piece's bytes (CPU, no copy; the view keeps ``t`` alive)."""
    size = t.element_size()
    step, per = t.stride(0) * size, t[0].numel() * size
    n = (t.shape[0] - 1) * step + per
    arr = (ctypes.c_ubyte * n).from_address(t.data_ptr())
    arr._kvown_owner = t  # type: ignore[attr-defined]  # the memory stays alive
    return memoryview(arr).cast("B"), step, per


def block_views(pools: RankPools, block_size: int) -> BlockViews | None:
    """Where a block of ``pools`` is byte for byte a file block of ``block_size`` tokens
    (one rank holding every head, heads_major, on the CPU: the geometries agree), block
    ``b``'s bytes as writable views in file order (no copy): the block, else each
    layer's piece of it, else each field's piece of each layer (FlashAttention's K and V
    lie apart); the spans are taken once, each block's views are slices of them. None
    where they do not agree or a piece is strided (a cross-layer HND cache, K and V
    packed in the last axis): those go through staging (one copy)."""
    g = pools.geometry
    if not pools.canonical or pools.device.type != "cpu" or g.block_size != block_size:
        return None
    mem = pools.pools[0]
    kv = _kv(mem)
    spans: list[tuple[memoryview, int, int]] = []
    if kv is not None and kv[0].is_contiguous():
        spans.append(_span(kv))
    else:
        for li in range(g.num_layers):
            lv = mem.layer(li)
            if lv[0].is_contiguous():
                spans.append(_span(lv))
            elif all(f.is_contiguous() for f in lv[0]):
                spans.extend(_span(lv.select(1, k)) for k in range(lv.shape[1]))
            else:
                return None

    def views(b: int) -> list[memoryview]:
        return [v[b * step : b * step + per] for v, step, per in spans]

    return views


def direct(pools: RankPools, block_size: int) -> bool:
    """A block of ``pools`` is read and written in place (``block_views``), no staging."""
    return block_views(pools, block_size) is not None


def _canonical_shape(pools: RankPools, n: int, block_size: int) -> tuple[int, ...]:
    g = pools.geometry
    return (n, g.num_layers, g.num_fields, pools.kv_heads, block_size, g.head_dim)


def checksum(parts: Sequence[memoryview]) -> str:
    """The manifest's checksum of one block given as byte views in file order (xxh3
    streams: the digest of the block's bytes, as ``block_checksum``)."""
    if len(parts) == 1:
        return bytes_checksum(parts[0])
    h = hasher()
    for v in parts:
        h.update(v)
    return h.hexdigest()


def chunk_data(
    pools: RankPools, blocks: Sequence[int], staging: torch.Tensor | None
) -> tuple[list[memoryview], list[str]]:
    """The file bytes of ``blocks`` (canonical, in order) and each block's checksum,
    each block hashed once. ``staging``: a buffer of ``len(blocks)`` canonical blocks
    when not ``direct`` (one copy into it), else the blocks' own pieces are written."""
    if staging is None:
        at = block_views(pools, pools.geometry.block_size)
        assert at is not None  # direct
        views: list[memoryview] = []
        sums: list[str] = []
        for b in blocks:
            parts = at(b)
            views.extend(parts)
            sums.append(checksum(parts))
        return views, sums
    for k, b, n in _runs(blocks):  # one strided copy per run (and layer): per block is 10x slower
        for r in pools.primaries:
            h = pools.heads[r]
            for sel, hm in _hm_views(pools, r, b, n):
                staging[k : k + n, sel, :, h.start : h.stop].copy_(hm)
    views = [byte_view(staging[k]) for k in range(len(blocks))]
    return views, [checksum([v]) for v in views]


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
    at: BlockViews | None | bool = True,
) -> int:
    """Read one chunk file (``num_tokens`` tokens in ``len(checksums)`` blocks of
    ``file_block_size``) into ``blocks`` of ``pools`` (the destination's own blocks for
    these tokens); every file block is verified. Returns the blocks verified. Bytes land
    only in ``blocks`` (straight into them when ``direct``; else only once the whole
    chunk is verified)."""
    size = header.entries[TENSOR].end - header.entries[TENSOR].begin
    nbytes = size // max(1, len(checksums))
    if at is True:  # else the caller's ``block_views(pools, file_block_size)``
        at = block_views(pools, file_block_size)
    if callable(at):
        for i, b in enumerate(blocks):
            _stop(stop)
            parts = at(b)
            read_into(f, header, TENSOR, parts, offset=i * nbytes)
            _verify(parts, checksums[i], i)
        return len(blocks)
    shape = _canonical_shape(pools, len(checksums), file_block_size)
    buf = staging.take(shape, pools.geometry.dtype)
    try:
        for i in range(len(checksums)):
            _stop(stop)
            view = writable_byte_view(buf[i])
            read_into(f, header, TENSOR, [view], offset=i * nbytes)
            _verify([view], checksums[i], i)
        _install(pools, blocks, buf, num_tokens)
    finally:
        staging.give(buf)
    return len(checksums)


def land_chunk(
    data: torch.Tensor,
    checksums: Sequence[str],
    num_tokens: int,
    pools: RankPools,
    blocks: Sequence[int],
) -> int:
    """A chunk held in host memory (canonical blocks ``data``, ``num_tokens`` tokens) into
    ``blocks`` of ``pools``, every block verified: straight into each block's pieces when
    ``direct`` (hashed there), else each source block verified first, then installed
    (one copy). Returns the blocks verified; ``TornFileError`` on a bad one."""
    at = block_views(pools, data.shape[4])
    if at is not None:
        for i, b in enumerate(blocks):
            parts, src, pos = at(b), byte_view(data[i]), 0
            for v in parts:
                v[:] = src[pos : pos + v.nbytes]
                pos += v.nbytes
            _verify(parts, checksums[i], i)
        return len(blocks)
    for i in range(len(checksums)):
        _verify([byte_view(data[i])], checksums[i], i)
    _install(pools, blocks, data, num_tokens)
    return len(checksums)


def read_into(
    f: BinaryIO, header: Header, name: str, out: Sequence[memoryview], *, offset: int = 0
) -> None:
    """Read ``sum(v.nbytes)`` bytes of tensor ``name``, from byte ``offset`` of it, into
    the writable byte views ``out`` in order (one block, or the pieces of one block in an
    engine's caches), with as few ``preadv`` calls as the pieces allow."""
    e = header.entries[name]
    views = list(out)
    total = sum(v.nbytes for v in views)
    if not 0 <= offset <= offset + total <= e.end - e.begin:
        raise ValueError(f"read_into {name!r}: bytes [{offset}, +{total}) of {e}")
    pos, fd, got = header.data_start + e.begin + offset, f.fileno(), 0
    while views:
        n = os.preadv(fd, views[:IOV_MAX], pos + got)
        if not n:
            raise TornFileError(f"tensor {name!r}: {got} of {total} bytes")
        got += n
        while views and n >= views[0].nbytes:  # drop what is full, keep the rest of one
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def _stop(stop: Callable[[], bool] | None) -> None:
    if stop is not None and stop():
        raise Stopped("cancelled")


def _verify(parts: Sequence[memoryview], want: str, i: int) -> None:
    if (got := checksum(parts)) != want:
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
    for r in range(pools.tp):
        h = pools.heads[r]
        for k, b, n in _runs(blocks):
            for sel, hm in _hm_views(pools, r, b, n):
                hm.copy_(buf[k : k + n, sel, :, h.start : h.stop])


def _hm_views(pools: RankPools, r: int, b: int, n: int) -> list[tuple[slice | int, torch.Tensor]]:
    """Blocks ``[b, b + n)`` of rank ``r`` as heads_major views: ``(slice(None), [n, L,
    K, h, T, D])`` where one tensor holds every layer, else ``(layer, [n, K, h, T, D])``
    per layer (an engine's per-layer caches, through ``BlockMemory.layer``)."""
    mem = pools.pools[r]
    kv = _kv(mem)
    if kv is not None:
        return [(slice(None), kv[b : b + n].permute(_to_hm(pools)))]
    perm = (0, *pools.to_hm[1:])
    return [(li, mem.layer(li)[b : b + n].permute(perm)) for li in range(pools.geometry.num_layers)]


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
