"""``Slabs``: ``DistTransport``'s receive buffers, reused (``refimpl.transport_dist``)."""

from __future__ import annotations

import threading
import weakref

import torch

from refimpl.checksum import byte_view

__all__ = ["Slabs"]


class _Lease:
    """Held by every view of one receive buffer: when the last view is gone, so is it."""

    __slots__ = ("buf", "__weakref__")

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf


class Slabs:
    """Receive buffers by size, reused: one goes back once no view of it is left (its
    lease's end), and at most ``keep`` bytes of idle ones are kept."""

    def __init__(self, keep: int) -> None:
        self.keep, self.kept = keep, 0
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, n: int) -> tuple[torch.Tensor, memoryview]:
        """A buffer of ``n`` bytes and its read-only view (the one way to its bytes)."""
        with self._lock:
            free = self._free.get(n)
            buf = free.pop() if free else None
            if buf is not None:
                self.kept -= n
        if buf is None:
            buf = torch.empty(n, dtype=torch.uint8)
        lease = _Lease(buf)
        weakref.finalize(lease, self._give, buf)
        return buf, byte_view(buf, owner=lease)

    def _give(self, buf: torch.Tensor) -> None:
        with self._lock:
            if self.kept + buf.numel() <= self.keep:
                self._free.setdefault(buf.numel(), []).append(buf)
                self.kept += buf.numel()
