"""Strided views of one layer of a pool's blocks: gather, scatter, raw writes (torch only).

Every pool (``BlockMemory``) answers ``layer(l)``: a view ``[capacity, fields, a, b,
head_dim]`` of that layer of every block, in the pool's block order (``a, b`` = heads,
slots for heads_major; slots, heads for tokens_major). A kvown pool's view is a slice of
its block-major tensor; an engine's registered cache (``refimpl.memory.registered``) is
a permuted view of the engine's own tensor, whose strides may put K and V of one block
far apart (FlashAttention's ``[2, blocks, ...]``). These helpers read and write through
such views without assuming contiguity: where one block's layer piece is contiguous they
move it as raw bytes (one memcpy per block on CPU, one indexed copy elsewhere), else by
one strided torch copy.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from refimpl.checksum import Buffer, copy_bytes_into, hasher, tensor_from_bytes

PIECE = 1 << 18  # bytes copied, then hashed where they landed while in cache (L2: 1 MiB a core)


def piece_bytes(lv: torch.Tensor) -> int:
    """Bytes of one block's piece of a layer view ``[capacity, ...]``."""
    return lv[0].numel() * lv.element_size() if lv.shape[0] else 0


def rows(lv: torch.Tensor) -> torch.Tensor | None:
    """``lv`` as ``[capacity, piece_bytes]`` uint8 (a view) where each block's piece is
    one contiguous byte range (any stride between blocks), else None."""
    if lv.shape[0] == 0 or not lv[0].is_contiguous():
        return None
    return lv.view(torch.uint8).view(lv.shape[0], -1)


def gather_layer(
    lv: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The pieces of blocks ``idx`` (a long tensor) in that order, as one contiguous uint8
    tensor ``[n, piece_bytes]`` (into ``out``, a uint8 buffer of that many bytes, if given)."""
    n, per = len(idx), piece_bytes(lv)
    raw = rows(lv)
    if raw is not None:
        if out is None:
            return raw.index_select(0, idx.to(raw.device))
        torch.index_select(raw, 0, idx, out=out.view(n, per))
        return out.view(n, per)
    if out is None:  # one strided gather, contiguous result
        return lv.index_select(0, idx.to(lv.device)).view(torch.uint8).view(n, -1)
    torch.index_select(lv, 0, idx, out=out.view(lv.dtype).view(n, *lv.shape[1:]))
    return out.view(n, per)


def _span(raw: torch.Tensor) -> memoryview:
    """A writable byte view from block 0's piece to the last block's (CPU, no copy):
    block ``b``'s piece starts at ``b * raw.stride(0)``."""
    n = (raw.shape[0] - 1) * raw.stride(0) + raw.shape[1]
    arr = (ctypes.c_ubyte * n).from_address(raw.data_ptr())
    arr._kvown_owner = raw  # type: ignore[attr-defined]  # keep the memory alive
    return memoryview(arr).cast("B")


def scatter_layer(lv: torch.Tensor, blocks: Sequence[int], payload: Buffer) -> None:
    """Write the pieces in ``payload`` (block order, this view's layout) into ``blocks``."""
    src = memoryview(payload).cast("B")
    if not blocks:
        return
    per = src.nbytes // len(blocks)
    raw = rows(lv)
    if raw is not None and raw.device.type == "cpu":
        dst, stride = _span(raw), raw.stride(0)
        for j, b in enumerate(blocks):
            at = b * stride
            dst[at : at + per] = src[j * per : (j + 1) * per]
        return
    idx = torch.as_tensor(list(blocks), dtype=torch.long, device=lv.device)
    data = tensor_from_bytes(payload, lv.dtype, (len(blocks), *lv.shape[1:])).to(lv.device)
    lv.index_copy_(0, idx, data)


Landing = tuple[memoryview, int, int]  # a writable span from block 0, its stride, capacity


def landing(lv: torch.Tensor) -> Landing | None:
    """Where ``copy_hashed`` writes into a layer view (``lv``, or ``kv`` for whole blocks):
    a writable byte span from block 0, the stride between blocks and their count, on CPU
    where each block's piece is one contiguous byte range; else None (the caller hashes,
    then writes). One per view is enough: callers keep it for the chunks that follow."""
    raw = rows(lv)
    if raw is None or raw.device.type != "cpu":
        return None
    return _span(raw), raw.stride(0), raw.shape[0]


def copy_hashed(span: Landing, blocks: Sequence[int], payload: Buffer) -> str:
    """Copy the pieces in ``payload`` (block order) into ``blocks`` of a ``landing`` span,
    and return the xxh3-64 (``refimpl.checksum``) of the bytes as they landed, in block
    order: each piece of at most ``PIECE`` bytes is hashed right after it is written,
    from cache (one read of the payload from memory, not two)."""
    (dst, stride, capacity), src = span, memoryview(payload).cast("B")
    _check_ids(blocks, capacity, "copy_hashed")
    per, h = src.nbytes // len(blocks), hasher()
    if per <= PIECE:  # a layer's piece of each block (64 KiB here): one slice each
        for j, b in enumerate(blocks):
            at = b * stride
            dst[at : at + per] = src[j * per : (j + 1) * per]
            h.update(dst[at : at + per])
        return str(h.hexdigest())
    for j, b in enumerate(blocks):
        for k in range(0, per, PIECE):
            at, n = b * stride + k, min(PIECE, per - k)
            dst[at : at + n] = src[j * per + k : j * per + k + n]
            h.update(dst[at : at + n])
    return str(h.hexdigest())


def _check_ids(blocks: Sequence[int], capacity: int, what: str) -> None:
    """ValueError unless ``blocks`` is a non-empty run of ints in [0, capacity) (checked
    at C speed: set of types, min, max)."""
    if not blocks or set(map(type, blocks)) != {int} or min(blocks) < 0 or max(blocks) >= capacity:
        raise ValueError(f"{what}: blocks {list(blocks)!r:.60} not in [0, {capacity})")


def gather_into(span: Landing, blocks: Sequence[int], out: memoryview) -> None:
    """Copy the pieces of ``blocks`` of a ``landing`` span (read, not written) into
    ``out`` (writable, contiguous) in block order: one memcpy per piece, no torch
    dispatch (``Stream.copy_layer``'s copy of a layer at ``send_layer``)."""
    (src, stride, capacity), n = span, len(blocks)
    _check_ids(blocks, capacity, "gather_into")
    per = out.nbytes // n
    for j, b in enumerate(blocks):
        out[j * per : (j + 1) * per] = src[b * stride : b * stride + per]


def write_bytes(out: torch.Tensor, payload: Buffer) -> None:
    """Copy raw bytes (``out``'s shape, row-major) into ``out``: one memcpy when it is a
    contiguous CPU tensor, one per slice of its first axis when each is (K and V of a
    FlashAttention block), else one strided copy."""
    if out.device.type == "cpu" and out.is_contiguous():
        copy_bytes_into(out, payload)
        return
    if out.device.type == "cpu" and out.dim() > 1 and out[0].is_contiguous():
        src = memoryview(payload).cast("B")
        per = src.nbytes // out.shape[0]
        for i in range(out.shape[0]):
            copy_bytes_into(out[i], src[i * per : (i + 1) * per])
        return
    t = tensor_from_bytes(payload, out.dtype, tuple(out.shape))
    out.copy_(t.to(out.device) if out.device.type != "cpu" else t)
