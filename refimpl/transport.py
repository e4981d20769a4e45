"""The narrow transport under the data path, and an in-process implementation with faults.

Everything that crosses is a JSON-serialisable header (for example a chunk header, or a
manifest's ``to_json_dict()``) plus a byte payload. No Python object is shared between
the sides, so a torch.distributed (gloo/NCCL) or RDMA transport can implement the same
three calls:

    send(channel, header, payload)   queue one message; never blocks on the receiver
    poll(channel) -> [(header, payload)]   everything delivered since the last poll
    abort(channel)                   drop everything in flight on the channel

Delivery is at most once per message unless a fault says otherwise; order is FIFO unless
a fault reorders. The receiver must verify payloads itself (checksums) and fence stale
ones (epochs, read with ``epoch_of``: an int only): a transport promises nothing about
content.

``InProcessTransport`` round-trips every header through ``json.dumps``/``json.loads``, so a
header holding anything but JSON fails at ``send``. Payloads are passed by reference by
default (``copy_payload=False``), like an RDMA read from registered memory: the sender
must not change the bytes until the receiver has consumed them, which a frozen snapshot
guarantees. ``copy_payload=True`` copies them at ``send`` instead.

``revocable=False`` is a transport with no revoke (one-sided RDMA writes, a NIXL or
Mooncake transfer batch): a write once posted lands or fails on its own, and neither side
can take it back (``spec/behaviours/irrevocable.py``). A receiver must then hold the
destination until the writer is known to have quiesced; ``abort`` stays the environment's
(a crash), never a way to stop a write.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol

Header = dict[str, Any]
Payload = bytes | bytearray | memoryview
Message = tuple[Header, Payload]


class Transport(Protocol):
    def send(self, channel: str, header: Mapping[str, Any], payload: Payload = b"") -> None: ...

    def poll(self, channel: str) -> list[Message]: ...

    def abort(self, channel: str) -> int: ...


class Fault(Enum):
    """Environment actions, each applied to the next message sent on a channel."""

    LOSE = "lose"  # the message never arrives
    DUPLICATE = "duplicate"  # it arrives twice
    REORDER = "reorder"  # it arrives after the message sent after it
    CORRUPT = "corrupt"  # one payload byte is flipped in transit


class InProcessTransport:
    """FIFO channels in one process, with fault hooks for the spec's environment actions."""

    def __init__(self, *, copy_payload: bool = False, revocable: bool = True) -> None:
        self.copy_payload = copy_payload
        self.revocable = revocable  # False: a posted write cannot be taken back
        self._queues: dict[str, deque[tuple[str, Payload]]] = {}
        self._held: dict[str, tuple[str, Payload]] = {}  # a reordered message, waiting
        self._faults: dict[str, deque[Fault | None]] = {}  # None: let one message pass
        self.stats: Counter[str] = Counter()  # sent, delivered, lost, duplicated, ...

    def inject(self, channel: str, fault: Fault | str, count: int = 1, *, skip: int = 0) -> None:
        """Let ``skip`` messages pass, then apply ``fault`` to each of the next ``count``.

        Faults queue up per channel in the order injected.
        """
        plan: list[Fault | None] = [None] * skip + [Fault(fault)] * count
        self._faults.setdefault(channel, deque()).extend(plan)

    def send(self, channel: str, header: Mapping[str, Any], payload: Payload = b"") -> None:
        text = json.dumps(header, allow_nan=False, separators=(",", ":"))
        data: Payload = bytes(payload) if self.copy_payload else payload
        self.stats["sent"] += 1
        queue = self._queues.setdefault(channel, deque())
        pending = self._faults.get(channel)
        fault = pending.popleft() if pending else None
        if fault is Fault.LOSE:
            self.stats["lost"] += 1
            return
        if fault is Fault.CORRUPT:
            data = _flip_a_byte(data)
            self.stats["corrupted"] += 1
        if fault is Fault.REORDER and channel not in self._held:
            self._held[channel] = (text, data)
            self.stats["reordered"] += 1
            return
        queue.append((text, data))
        if fault is Fault.DUPLICATE:
            queue.append((text, data))
            self.stats["duplicated"] += 1
        if channel in self._held:
            queue.append(self._held.pop(channel))

    def poll(self, channel: str) -> list[Message]:
        queue = self._queues.get(channel, deque())
        if channel in self._held:  # nothing came after it: it arrives late, but arrives
            queue.append(self._held.pop(channel))
        out = [(json.loads(text), data) for text, data in queue]
        queue.clear()
        self.stats["delivered"] += len(out)
        return out

    def abort(self, channel: str) -> int:
        """Drop every message in flight on ``channel`` and its pending faults; return count."""
        dropped = len(self._queues.pop(channel, ())) + (self._held.pop(channel, None) is not None)
        self._faults.pop(channel, None)
        self.stats["aborted"] += dropped
        return dropped

    def in_flight(self, channel: str) -> int:
        return len(self._queues.get(channel, ())) + (channel in self._held)


def epoch_of(header: Mapping[str, Any]) -> int | None:
    """A peer's epoch if it is an int (``true`` and ``1.0`` are not epoch 1), else None."""
    e = header.get("epoch")
    return e if type(e) is int else None


def _flip_a_byte(data: Payload) -> bytes:
    """A corrupted copy: the middle byte inverted (an empty payload gains one byte)."""
    buf = bytearray(data)
    if not buf:
        return b"\xff"
    buf[len(buf) // 2] ^= 0xFF
    return bytes(buf)
