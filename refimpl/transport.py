"""The narrow transport under the data path, and an in-process implementation with faults.

Everything that crosses is a JSON-serialisable header (for example a chunk header, or a
manifest's ``to_json_dict()``) plus a byte payload. No Python object is shared between
the sides, so a torch.distributed (gloo/NCCL) or RDMA transport can implement the same
three calls:

    send(channel, header, payload)   queue one message; never blocks on the receiver
    poll(channel) -> [(header, payload)]   everything delivered since the last poll
    abort(channel)                   drop everything in flight on the channel
    fence(channel, epoch)            drop everything of epoch <= ``epoch`` on the channel,
                                     now and later (an ended attempt's late messages)

Delivery is at most once per message unless a fault says otherwise; order is FIFO unless
a fault reorders. The receiver must verify payloads itself (checksums) and fence stale
ones (epochs, read with ``epoch_of``: an int only): a transport promises nothing about
content.

``InProcessTransport`` round-trips every header through ``json.dumps``/``json.loads``, so a
header holding anything but JSON fails at ``send``. Payloads are passed by reference by
default (``copy_payload=False``), like an RDMA read from registered memory: the sender
must not change the bytes until the receiver has consumed them, which a frozen snapshot
guarantees. ``copy_payload=True`` copies them at ``send`` instead.

What is not polled yet is bounded (channels, messages per channel; ``Inbox`` for a
transport between processes also bytes): past a cap a message is dropped and counted in
``stats["dropped_full"]``. It is also fenced (``Fences``, one rule for both transports):
once the side that reads a channel ended an attempt (``fence``), every message of that
epoch or an older one (or with no int ``epoch``) is dropped on arrival, so a cancelled
request's late chunks are never kept. The fences are bounded too (the oldest are
forgotten past ``max_fences``).

``revocable=False`` is a transport with no revoke (one-sided RDMA writes, a NIXL or
Mooncake transfer batch): a write once posted lands or fails on its own, and neither side
can take it back (``spec/behaviours/irrevocable.py``). A receiver must then hold the
destination until the writer is known to have quiesced; ``abort`` stays the environment's
(a crash), never a way to stop a write. The writer knows it has from its batch's status:
``writes_pending(channel, epoch)`` counts its writes (messages with a payload) of
``epoch`` on ``channel`` that have neither landed nor failed (RDMA completions, NIXL's
``getXferStatus``); a ``Sender`` says Quiesced only once it is 0. A transport with
``revocable = False`` must have it.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

Header = dict[str, Any]
Payload = bytes | bytearray | memoryview
Message = tuple[Header, Payload]


class Transport(Protocol):
    """What Sender and Receiver need of a transport. Two more methods are optional and
    used when present (``refimpl.api.wire``): ``fence(channel, epoch) -> int`` (drop an
    ended attempt's late messages on arrival) and ``failed(channel) -> str`` (the peer's
    link broke)."""

    def send(self, channel: str, header: Mapping[str, Any], payload: Payload = b"") -> None: ...

    def poll(self, channel: str) -> list[Message]: ...

    def abort(self, channel: str) -> int: ...


T = TypeVar("T")


class Fences:
    """Per channel, the newest ended epoch: its messages and older ones are void (the
    one fence rule of both transports). Bounded: past ``max_fences`` the oldest go."""

    def __init__(self, stats: Counter[str], max_fences: int = 1 << 16) -> None:
        self.stats, self.max_fences = stats, max_fences
        self._at: OrderedDict[str, int] = OrderedDict()

    def admits(self, channel: str, epoch: int | None) -> bool:
        """False (counted as ``fenced``) for a message of a fenced epoch, or of none."""
        if not self.void(channel, epoch):
            return True
        self.stats["fenced"] += 1
        return False

    def void(self, channel: str, epoch: int | None) -> bool:
        f = self._at.get(channel)
        return f is not None and (epoch is None or epoch <= f)

    def fence(self, channel: str, epoch: int) -> None:
        self._at[channel] = max(epoch, self._at.pop(channel, epoch))
        while len(self._at) > self.max_fences:
            self._at.popitem(last=False)

    def __len__(self) -> int:
        return len(self._at)


class Inbox(Generic[T]):
    """Messages not polled yet, per channel, bounded, fenced (``Fences``)."""

    def __init__(
        self,
        stats: Counter[str],
        *,
        max_channels: int = 4096,
        max_messages: int = 1 << 20,
        max_bytes: int = 1 << 32,
        max_fences: int = 1 << 16,
    ) -> None:
        self.stats = stats
        self.max_channels, self.max_messages, self.max_bytes = max_channels, max_messages, max_bytes
        self.fences = Fences(stats, max_fences)
        self._q: dict[str, deque[tuple[T, int | None, int]]] = {}  # (item, epoch, bytes)
        self.messages = self.bytes = 0

    def put(self, channel: str, item: T, epoch: int | None, nbytes: int) -> bool:
        """File one message, unless fenced or past a cap (dropped, counted); at a cap the
        oldest other channels' messages are dropped first (``evicted_channels``)."""
        if not self.fences.admits(channel, epoch):
            return False
        q = self._q.get(channel)
        while (q is None and len(self._q) >= self.max_channels) or (
            self.messages >= self.max_messages or self.bytes + nbytes > self.max_bytes
        ):
            # full: the channel filed longest ago (never polled since) gives way, so that a
            # flood of junk channels cannot starve a real one (issue #34); a message that
            # cannot fit, or a channel whose own backlog is the excess, is dropped
            old = next((c for c in self._q if c != channel), None)
            if old is None or nbytes > self.max_bytes:
                self.stats["dropped_full"] += 1
                return False
            self.stats["dropped_full"] += self.drop(old)
            self.stats["evicted_channels"] += 1
        if q is None:
            q = self._q[channel] = deque()
        q.append((item, epoch, nbytes))
        self.messages, self.bytes = self.messages + 1, self.bytes + nbytes
        return True

    def take(self, channel: str) -> list[T]:
        """Everything filed under ``channel``, in order; the channel's entry is gone."""
        q = self._q.pop(channel, None)
        if not q:
            return []
        self.messages -= len(q)
        self.bytes -= sum(n for _, _, n in q)
        return [item for item, _, _ in q]

    def drop(self, channel: str) -> int:
        return len(self.take(channel))

    def fence(self, channel: str, epoch: int) -> int:
        """From now on drop ``channel``'s messages of epoch <= ``epoch``; returns those
        already filed that were dropped."""
        self.fences.fence(channel, epoch)
        q = self._q.pop(channel, None)
        if not q:
            return 0
        for item, e, n in q:
            if self.fences.void(channel, e):
                self.messages, self.bytes = self.messages - 1, self.bytes - n
                self.stats["fenced"] += 1
            else:
                self._q.setdefault(channel, deque()).append((item, e, n))
        return len(q) - len(self._q.get(channel, ()))

    def sizes(self) -> dict[str, int]:
        """What is kept: channels, messages, bytes, fences (a memory test reads these)."""
        return {
            "channels": len(self._q),
            "messages": self.messages,
            "bytes": self.bytes,
            "fences": len(self.fences),
        }


class Fault(Enum):
    """Environment actions, each applied to the next message sent on a channel."""

    LOSE = "lose"  # the message never arrives
    DUPLICATE = "duplicate"  # it arrives twice
    REORDER = "reorder"  # it arrives after the message sent after it
    CORRUPT = "corrupt"  # one payload byte is flipped in transit


class InProcessTransport:
    """FIFO channels in one process, with fault hooks for the spec's environment actions."""

    def __init__(
        self,
        *,
        copy_payload: bool = False,
        revocable: bool = True,
        max_channels: int = 4096,
        max_per_channel: int = 1 << 20,
        max_fences: int = 1 << 16,
    ) -> None:
        self.copy_payload = copy_payload
        self.revocable = revocable  # False: a posted write cannot be taken back
        self._queues: dict[str, deque[tuple[str, Payload]]] = {}
        self._held: dict[str, tuple[str, Payload]] = {}  # a reordered message, waiting
        self._faults: dict[str, deque[Fault | None]] = {}  # None: let one message pass
        self.stats: Counter[str] = Counter()  # sent, delivered, lost, duplicated, ...
        self.fences = Fences(self.stats, max_fences)
        self.max_channels, self.max_per_channel = max_channels, max_per_channel

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
        pending = self._faults.get(channel)
        fault = pending.popleft() if pending else None
        if pending is not None and not pending:
            del self._faults[channel]
        if not self.fences.admits(channel, epoch_of(header)):
            return  # an ended attempt's message: void on arrival
        queue = self._queues.get(channel)
        if queue is None and len(self._queues) >= self.max_channels:
            self.stats["dropped_full"] += 1
            return
        queue = self._queues.setdefault(channel, deque())
        if len(queue) >= self.max_per_channel:
            self.stats["dropped_full"] += 1
            return
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
        queue = self._queues.pop(channel, deque())  # an empty channel keeps no entry
        if channel in self._held:  # nothing came after it: it arrives late, but arrives
            queue.append(self._held.pop(channel))
        out = [(json.loads(text), data) for text, data in queue]
        self.stats["delivered"] += len(out)
        return out

    def abort(self, channel: str) -> int:
        """Drop every message in flight on ``channel`` and its pending faults; return count."""
        dropped = len(self._queues.pop(channel, ())) + (self._held.pop(channel, None) is not None)
        self._faults.pop(channel, None)
        self.stats["aborted"] += dropped
        return dropped

    def fence(self, channel: str, epoch: int) -> int:
        """Drop ``channel``'s messages of epoch <= ``epoch``: in flight, and sent later."""
        self.fences.fence(channel, epoch)
        dropped = 0
        held = self._held.get(channel)
        if held is not None and self.fences.void(channel, epoch_of(json.loads(held[0]))):
            del self._held[channel]
            dropped += 1
        q = self._queues.pop(channel, None)
        if q:
            keep = deque(m for m in q if not self.fences.void(channel, epoch_of(json.loads(m[0]))))
            dropped += len(q) - len(keep)
            if keep:
                self._queues[channel] = keep
        self.stats["fenced"] += dropped
        return dropped

    def in_flight(self, channel: str) -> int:
        return len(self._queues.get(channel, ())) + (channel in self._held)

    def writes_pending(self, channel: str, epoch: int) -> int:
        """Writes (messages with a payload) of ``epoch`` on ``channel`` not landed yet: a
        write lands when the side that reads the channel polls it."""
        held = self._held.get(channel)
        queued = [*self._queues.get(channel, ()), *([held] if held is not None else [])]
        return sum(1 for text, data in queued if len(data) and epoch_of(json.loads(text)) == epoch)

    def sizes(self) -> dict[str, int]:
        """What this transport keeps per channel (queues, reordered messages, pending
        faults, fences): a memory test reads these."""
        return {
            "channels": len(self._queues),
            "messages": sum(len(q) for q in self._queues.values()) + len(self._held),
            "faults": len(self._faults),
            "fences": len(self.fences),
        }


def epoch_of(header: Mapping[str, Any]) -> int | None:
    """A peer's epoch if it is an int (``true`` and ``1.0`` are not epoch 1), else None."""
    if type(header) is dict:  # the common case, without the ABC's isinstance
        e = header.get("epoch")
    else:
        e = header.get("epoch") if isinstance(header, Mapping) else None
    return e if type(e) is int else None


def _flip_a_byte(data: Payload) -> bytes:
    """A corrupted copy: the middle byte inverted (an empty payload gains one byte)."""
    buf = bytearray(data)
    if not buf:
        return b"\xff"
    buf[len(buf) // 2] ^= 0xFF
    return bytes(buf)
