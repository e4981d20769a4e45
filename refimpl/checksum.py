"""xxh3-64 checksums of tensor blocks, computed over a zero-copy byte view.

A block is one contiguous slab of the pool (``kv[b]``), so its bytes can be hashed where
they lie: ``t.view(uint8)`` reinterprets any dtype (float16, bfloat16, float8, ...)
without a copy, and a ctypes array over ``data_ptr()`` exposes the CPU memory through the
buffer protocol (no numpy: torch and xxhash are the data path's only dependencies). The
digest is lowercase hex, 16 digits, as in ``Manifest.block_checksums``.

xxh3 runs near memcpy speed on one core; zlib's crc32 runs near 2 GiB/s. Note that the
Python binding holds the GIL, so hashing does not overlap with other Python threads.
"""

from __future__ import annotations

import ctypes
import re
import warnings

import torch
import xxhash

Buffer = bytes | bytearray | memoryview
_HEX = re.compile(r"[0-9a-f]{16}")


def _raw_view(t: torch.Tensor, what: str, owner: object = None) -> memoryview:
    """A writable memoryview of a contiguous CPU tensor's bytes (no copy).

    The ctypes array keeps a reference to the tensor (or to ``owner``, which must keep
    the tensor), and the memoryview keeps the array, so the memory stays valid for as
    long as the view (or any slice of it) is alive.
    """
    if t.device.type != "cpu":
        raise ValueError(f"{what} needs CPU memory, got {t.device}; stage it to host first")
    if not t.is_contiguous():
        raise ValueError(f"{what} needs a contiguous tensor (a pool block is one)")
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray())
    arr = (ctypes.c_ubyte * n).from_address(t.data_ptr())
    arr._kvown_owner = t if owner is None else owner  # type: ignore[attr-defined]  # alive
    return memoryview(arr).cast("B")


def byte_view(t: torch.Tensor, owner: object = None) -> memoryview:
    """The bytes of a contiguous CPU tensor, read-only, without copying them. ``owner``:
    what the view keeps alive instead of ``t`` (it must keep ``t``; a buffer pool's lease,
    whose end says that no view of the buffer is left)."""
    return _raw_view(t, "byte_view", owner).toreadonly()


def writable_byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable, without copying them (``readinto``)."""
    return _raw_view(t, "writable_byte_view")


def copy_bytes_into(t: torch.Tensor, data: Buffer) -> None:
    """Copy ``data`` into a contiguous CPU tensor's bytes: one memcpy, no torch dispatch."""
    dst = _raw_view(t, "copy_bytes_into")
    src = memoryview(data).cast("B")
    if src.nbytes != dst.nbytes:
        raise ValueError(f"copy_bytes_into: {src.nbytes} bytes into a {dst.nbytes}-byte tensor")
    dst[:] = src


def bytes_checksum(data: Buffer) -> str:
    """xxh3-64 of a buffer, as 16 lowercase hex digits."""
    return xxhash.xxh3_64_hexdigest(data)


def is_checksum(c: object) -> bool:
    """A checksum of this convention: 16 lowercase hex digits."""
    return isinstance(c, str) and _HEX.fullmatch(c) is not None


def hasher() -> xxhash.xxh3_64:
    """A running checksum: ``update`` it with consecutive pieces of a buffer, and its
    ``hexdigest()`` is that buffer's ``bytes_checksum`` (the same convention, taken while
    each piece is in cache, e.g. right after copying it)."""
    return xxhash.xxh3_64()


def block_checksum(t: torch.Tensor) -> str:
    """xxh3-64 of a tensor's bytes; CUDA tensors are copied to host first."""
    if t.device.type != "cpu":
        t = t.to("cpu")
    return bytes_checksum(byte_view(t.contiguous()))


def tensor_from_bytes(data: Buffer, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A CPU tensor viewing ``data`` (no copy). Treat it as read-only; copy_ out of it."""
    with warnings.catch_warnings():
        # A read-only buffer is fine here: callers only read from the tensor.
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(data, dtype=torch.uint8)
    return raw.view(dtype).view(shape)
