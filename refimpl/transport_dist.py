"""``DistTransport``: the ``Transport`` of ``refimpl.transport`` over torch.distributed
point-to-point (gloo on CPU, NCCL on CUDA: the same code, tensors on ``device``).

One process per side (or per TP rank) joins one process group; ``route(channel)`` names
the process a channel's messages go to (``handoff_route``: a request's ``to_receiver``
channel to the receiver's process, each ``to_rank(r)`` channel to source rank r's). The
messages queued for one peer leave as one batch of up to three P2P frames, in order on
one tag:

    int64[2] (header bytes, payload bytes) | uint8 JSON header | uint8 payload (if any)

where the header is ``{"ch": channel, "h": header}`` for one message, or
``{"batch": [{"ch", "h", "n": payload bytes}, ...]}`` for several, their payloads
concatenated in order (at most ``MAX_BATCH_BYTES``, else the next batch; one message
larger than that goes alone): a whole-block request's 128 blocks of 2 MiB cost four
batches of three frames, not three frames per block (each blocking frame is a wake-up
of a thread and a hand-off of the GIL; on a loaded machine a few ms each). Payloads that
lie side by side in memory (the blocks of a request allocated in a row) leave as one
frame uncopied; others are copied once into the send thread's reused buffer. A payload
frame is received into a reused buffer (``Slabs``: a fresh one costs a page fault per
page on first touch) that goes back only once no message cut from it is referenced.

``revocable=False`` is ``InProcessTransport``'s: a write sent cannot be taken back (the
Receiver quarantines an attempt it gives up while writes may land); ``writes_pending``
counts a channel's writes of an attempt not handed to the peer yet (the Sender's batch
status before it says Quiesced).

``send`` queues them and returns (it never waits for the peer): one thread per peer sends
its batches in order with blocking ``dist.send``, and one thread per peer receives with
blocking ``dist.recv`` (gloo's ``irecv`` cannot be polled: its ``is_completed`` turns true
only in ``wait``) and files each message under its channel; ``poll`` takes what arrived
and never blocks. ``abort(channel)`` drops what arrived and was not polled;
``fence(channel, epoch)`` also drops every later message of that attempt or an older one
on arrival (a cancelled request's late chunks are not kept). What is not polled yet is
bounded (``refimpl.transport.Inbox``: channels, messages, bytes; past a cap a message is
dropped and counted in ``stats``). A peer's frame is untrusted: a header that is not strict
JSON (``spec.strict_json.loads_strict``: too deep, a duplicate key, NaN, ...),
not ``{"ch": str, "h": object}``, or on a channel that does not route here is dropped and
counted (a batch whose sizes do not add up to its payload frame is dropped whole;
``route`` must be the same function in every process; ``stats["malformed"]``,
``stats["misrouted"]``, the last reasons in
``dropped``), and the link goes on serving; only a size frame out of bounds ends it (the
frames after it cannot be told apart), as a crash does.

A link that fails (the peer's process died: gloo's ``recv`` raises at once) is the
transport's failure detection: ``failed(channel)`` names it (``peer P failed: ...``) for
every channel that routes to that peer, and ``Sender``/``Receiver`` end a live attempt
whose peer failed with that reason at their next ``poll``, not at a timer.
``close()``
tells every peer it is done and waits (bounded) for theirs, so no frame is left
unmatched when the process group is destroyed.
"""

from __future__ import annotations

import ctypes
import json
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from refimpl.checksum import byte_view, tensor_from_bytes
from refimpl.transport import Inbox, Message, Payload, epoch_of
from refimpl.transport_slabs import Slabs
from spec.manifest import MAX_INT_DIGITS, MAX_JSON_DEPTH
from spec.strict_json import StrictJSONError, loads_strict

TAG = 7301  # the one tag of the transport's frames (gloo keeps a pair's frames in order)
_CLOSE = -1  # a size frame (-1, 0): the peer sends nothing more
MAX_HEADER = 1 << 22  # bytes of one JSON header frame, at most (a manifest of 100k tokens)
MAX_PAYLOAD = 1 << 34  # bytes of one payload frame, at most
MAX_BATCH_BYTES = 1 << 26  # payload bytes one batch gathers, at most (one message may be more)
MAX_BATCH = 4096  # messages in one batch, at most
REUSE = 1 << 20  # a payload frame this large is received into a reused buffer (``Slabs``)
KEEP_BYTES = 1 << 28  # idle receive buffers kept for reuse, at most (bytes, per transport)
# A batch {"batch": [...]}, its entry {"ch", "h", "n"}, the header, the header's manifest
# (MAX_JSON_DEPTH: rope, arrays).
MAX_HEADER_DEPTH = MAX_JSON_DEPTH + 4


class DistTransport:
    """FIFO channels between processes of a torch.distributed group (see the module)."""

    def __init__(
        self,
        route: Callable[[str], int],
        *,
        peers: Sequence[int] | None = None,
        device: str | torch.device = "cpu",
        group: Any = None,
        revocable: bool = True,
        **caps: int,
    ) -> None:
        """``route``: channel -> the group rank it goes to. ``peers``: the ranks that may
        send here or be sent to (default every other rank of the group). ``revocable``:
        as ``InProcessTransport``'s (False: a write once sent cannot be taken back, so a
        Receiver quarantines; ``writes_pending`` is the Sender's batch status). ``caps``:
        the inbox's bounds (``Inbox``: max_channels, max_messages, max_bytes, max_fences)."""
        self.route, self.group, self.device = route, group, torch.device(device)
        self.revocable = revocable
        self._pending: Counter[tuple[str, int]] = Counter()  # writes not sent, per attempt
        self._keys: dict[int, deque[tuple[str, int] | None]] = {}  # per peer, in send order
        self.me = dist.get_rank(group)
        world = dist.get_world_size(group)
        self.peers = [p for p in (peers if peers is not None else range(world)) if p != self.me]
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter(sent=0, delivered=0, aborted=0, bytes_sent=0)
        self._inbox: Inbox[Message] = Inbox(self.stats, **caps)
        self._closed: set[int] = set()
        self.errors: list[str] = []  # a peer's link failed (a crash): its messages stop
        self.dropped: deque[str] = deque(maxlen=16)  # why the last dropped frames were
        self._failed: dict[int, str] = {}  # peer -> why its link failed
        self._outq: dict[int, queue.SimpleQueue[Any]] = {  # (json, payload, n) | frames
            p: queue.SimpleQueue() for p in self.peers
        }
        self._slabs = Slabs(KEEP_BYTES)  # payload frames received (CPU)
        self._sendbuf: dict[int, torch.Tensor] = {}  # per peer: a batch's payloads joined
        self._threads = [
            threading.Thread(target=fn, args=(p,), daemon=True, name=f"kvown-{fn.__name__}{p}")
            for p in self.peers
            for fn in (self._send_loop, self._recv_loop)
        ]
        for th in self._threads:
            th.start()

    # ------------------------------------------------------------ Transport
    def send(self, channel: str, header: Mapping[str, Any], payload: Payload = b"") -> None:
        dst = self.route(channel)
        if dst not in self._outq:
            raise ValueError(f"channel {channel!r} routes to rank {dst}, not a peer {self.peers}")
        n = memoryview(payload).nbytes
        entry = {"ch": channel, "h": header, "n": n}
        text = json.dumps(entry, allow_nan=False, separators=(",", ":"))  # raises here
        e = epoch_of(header)
        key = (channel, e) if n and e is not None else None  # a write of attempt e
        with self._lock:  # keys in the order the send thread takes the messages
            self._keys.setdefault(dst, deque()).append(key)
            if key is not None:
                self._pending[key] += 1
            self._outq[dst].put((text, payload, n))
        self.stats["sent"] += 1
        self.stats["bytes_sent"] += n

    def poll(self, channel: str) -> list[Message]:
        with self._lock:
            q = self._inbox.take(channel)
            self.stats["delivered"] += len(q)
        return q

    def abort(self, channel: str) -> int:
        with self._lock:
            dropped = self._inbox.drop(channel)
            self.stats["aborted"] += dropped
        return dropped

    def fence(self, channel: str, epoch: int) -> int:
        """Drop ``channel``'s messages of epoch <= ``epoch``: arrived, and arriving later."""
        with self._lock:
            return self._inbox.fence(channel, epoch)

    def writes_pending(self, channel: str, epoch: int) -> int:
        """Writes (messages with a payload) of ``epoch`` on ``channel`` not handed to the
        peer yet (its ``dist.send`` has not returned; a link that failed fails them)."""
        with self._lock:
            return self._pending.get((channel, epoch), 0)

    def _sent(self, peer: int, k: int | None) -> None:
        """``k`` messages to ``peer`` left (None: the link failed, every one is over)."""
        with self._lock:
            keys = self._keys.get(peer, deque())
            for _ in range(len(keys) if k is None else k):
                key = keys.popleft()
                if key is not None:
                    self._pending[key] -= 1
                    if self._pending[key] <= 0:
                        del self._pending[key]

    def sizes(self) -> dict[str, int]:
        """What the inbox keeps (channels, messages, bytes, fences): all bounded."""
        with self._lock:
            return self._inbox.sizes()

    # ------------------------------------------------------------ the frames
    def _send_loop(self, peer: int) -> None:
        """Send ``peer``'s frames in order (blocking here, never in ``send``)."""
        q, item = self._outq[peer], None
        try:
            while (item := q.get() if item is None else item) is not None:
                k = 0
                if isinstance(item, list):  # frames as they are (a close frame)
                    frames, item = item, None
                else:
                    batch, item = _gather(q, item)
                    frames = _frames(batch, lambda n: self._staging(peer, n))
                    self.stats["batches"] += 1  # messages sent / batches: how well they batch
                    k = len(batch)
                for t in frames:
                    dist.send(t.to(self.device), peer, self.group, tag=TAG)
                self._sent(peer, k)
        except Exception as e:  # the link is gone: the protocol's timeouts take over
            self.errors.append(f"send to {peer}: {type(e).__name__}: {e}")
            self._sent(peer, None)

    def _staging(self, peer: int, n: int) -> torch.Tensor:
        """``n`` bytes of ``peer``'s send buffer (only its send thread uses it, and only
        until its ``dist.send`` returned)."""
        buf = self._sendbuf.get(peer)
        if buf is None or buf.numel() < n:
            buf = self._sendbuf[peer] = torch.empty(n, dtype=torch.uint8)
        return buf[:n]

    def _recv_loop(self, peer: int) -> None:
        """File ``peer``'s messages under their channels until its close frame."""
        try:
            while True:
                size = self._recv(peer, 2, torch.int64)
                hlen, plen = (int(x) for x in size.tolist())
                if hlen == _CLOSE:
                    break
                if not (0 <= hlen <= MAX_HEADER and 0 <= plen <= MAX_PAYLOAD):
                    # dropped, and the next frame read as a size frame: a peer that did send
                    # frames of those sizes fails its link at the next recv (issue #34)
                    self.stats["malformed"] += 1
                    self.dropped.append(f"from {peer}: size frame ({hlen}, {plen}) out of bounds")
                    continue
                head = self._recv(peer, hlen, torch.uint8)
                payload = self._payload(peer, plen) if plen else b""
                self._arrive(peer, bytes(byte_view(head)), payload)
        except Exception as e:
            self.errors.append(f"recv from {peer}: {type(e).__name__}: {e}")
            self._failed[peer] = f"peer {peer} failed: {type(e).__name__}: {e!s:.200}"
        with self._lock:
            self._closed.add(peer)

    def failed(self, channel: str) -> str:
        """Why the process ``channel`` routes to is gone ("" while its link is up)."""
        try:
            return self._failed.get(self.route(channel), "")
        except Exception:
            return ""

    def _arrive(self, peer: int, head: bytes, payload: Payload) -> None:
        """One frame set from ``peer``: each of its messages filed, or the set dropped."""
        for h, p in self._unbatch(peer, head, payload):
            self._file(peer, h, p)

    def _unbatch(self, peer: int, head: bytes, payload: Payload) -> list[tuple[Any, Payload]]:
        """The (message, payload) pairs of one frame set: one message, or a batch whose
        payloads are cut from the payload frame (views, no copy). A header that is not
        strict JSON, or a batch whose sizes do not add up, is dropped whole (counted)."""
        try:
            msg = loads_strict(  # the one strict reader: a deep frame is refused
                head, max_bytes=MAX_HEADER, max_depth=MAX_HEADER_DEPTH,
                max_int_digits=MAX_INT_DIGITS, what="header frame",
            )  # fmt: skip
            if not (isinstance(msg, dict) and "batch" in msg):
                return [(msg, payload)]
            entries, sizes = msg["batch"], []
            if not isinstance(entries, list) or not 0 < len(entries) <= MAX_BATCH:
                raise StrictJSONError("batch is not a list of 1..MAX_BATCH messages")
            for e in entries:
                n = e.get("n") if isinstance(e, dict) else None
                if type(n) is not int or n < 0:
                    raise StrictJSONError(f"a batch entry's size {n!r:.20} is not an int >= 0")
                sizes.append(n)
            if sum(sizes) != memoryview(payload).nbytes:
                raise StrictJSONError(f"batch sizes add up to {sum(sizes)}, not the payload's")
        except StrictJSONError as e:
            self.stats["malformed"] += 1
            self.dropped.append(f"from {peer}: malformed header: {e!s:.100}")
            return []
        view, at = memoryview(payload), 0
        out: list[tuple[Any, Payload]] = []
        for entry, n in zip(entries, sizes, strict=True):
            out.append((entry, view[at : at + n] if n else b""))
            at += n
        return out

    def _file(self, peer: int, msg: Any, payload: Payload) -> None:
        """File one message under its channel, or drop it (counted) if it is malformed,
        routed elsewhere, fenced or past the inbox's caps."""
        ch, h = (msg.get("ch"), msg.get("h")) if isinstance(msg, dict) else (None, None)
        if not isinstance(ch, str) or not isinstance(h, dict):
            self.stats["malformed"] += 1
            self.dropped.append(f"from {peer}: malformed header: not {{'ch': str, 'h': object}}")
            return
        try:
            mine = self.route(ch) == self.me
        except Exception:
            mine = False
        if not mine:
            self.stats["misrouted"] += 1
            self.dropped.append(f"from {peer}: channel {ch!r:.80} does not route here")
            return
        n = memoryview(payload).nbytes
        with self._lock:
            self._inbox.put(ch, (h, payload), epoch_of(h), n)

    def _payload(self, peer: int, n: int) -> memoryview:
        """A payload frame of ``n`` bytes (a large one into a reused buffer, on CPU)."""
        if self.device.type != "cpu" or n < REUSE:
            return byte_view(self._recv(peer, n, torch.uint8))
        buf, view = self._slabs.take(n)
        dist.recv(buf, peer, self.group, tag=TAG)
        return view

    def _recv(self, peer: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        buf = torch.empty(n, dtype=dtype, device=self.device)
        dist.recv(buf, peer, self.group, tag=TAG)
        return buf.cpu() if buf.device.type != "cpu" else buf

    def close(self, timeout_s: float = 10.0) -> None:
        """Tell every peer this side is done; wait (bounded) for every send and for theirs."""
        for p in self.peers:
            self._outq[p].put([torch.tensor([_CLOSE, 0], dtype=torch.int64)])
            self._outq[p].put(None)
        end = time.monotonic() + timeout_s
        for th in self._threads:
            th.join(max(0.0, end - time.monotonic()))
        if alive := [th.name for th in self._threads if th.is_alive()]:
            raise TimeoutError(f"DistTransport.close: still waiting after {timeout_s}s: {alive}")


def _gather(q: queue.SimpleQueue[Any], first: Any) -> tuple[list[Any], Any]:
    """``first`` and the messages queued behind it, up to the batch's bounds; returns
    them and the next item (not taken in: a frame list, the end, or past the bounds)."""
    batch, size = [first], first[2]
    while len(batch) < MAX_BATCH:
        try:
            item = q.get_nowait()
        except queue.Empty:
            return batch, None
        if item is None or isinstance(item, list) or size + item[2] > MAX_BATCH_BYTES:
            return batch, item
        batch.append(item)
        size += item[2]
    return batch, None


def _frames(
    batch: list[Any], staging: Callable[[int], torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """The frames of a batch: sizes, the JSON header, the payloads (one frame: side by
    side in memory as they are, else joined into ``staging(n)``, or a new tensor)."""
    if len(batch) == 1:
        text, payload, n = batch[0]
        head = text.encode()  # one message: {"ch", "h", "n"} (the "n" is ignored)
    else:
        head = ('{"batch":[' + ",".join(text for text, _, _ in batch) + "]}").encode()
        n = sum(m[2] for m in batch)
        parts = [_u8(p) for _, p, k in batch if k]
        payload = _joined(parts, n, staging) if parts else b""
    frames = [torch.tensor([len(head), n], dtype=torch.int64), _u8(head)]
    if n:
        frames.append(payload if isinstance(payload, torch.Tensor) else _u8(payload))
    return frames


def _joined(
    parts: list[torch.Tensor], n: int, staging: Callable[[int], torch.Tensor] | None
) -> torch.Tensor:
    """The parts' bytes as one tensor: a view of their span where each one starts where
    the one before it ends (no copy), else copied into ``staging(n)``."""
    if len(parts) == 1:
        return parts[0]
    ends = [p.data_ptr() + p.numel() for p in parts[:-1]]
    if all(p.device.type == "cpu" for p in parts) and ends == [p.data_ptr() for p in parts[1:]]:
        arr = (ctypes.c_ubyte * n).from_address(parts[0].data_ptr())
        arr._kvown_owner = parts  # type: ignore[attr-defined]  # the parts' memory stays
        return tensor_from_bytes(memoryview(arr), torch.uint8, (n,))
    out = staging(n) if staging is not None else torch.empty(n, dtype=torch.uint8)
    return torch.cat(parts, out=out)


def _u8(data: Payload) -> torch.Tensor:
    """A uint8 tensor over the bytes (a view on CPU; only read by the send)."""
    return tensor_from_bytes(data, torch.uint8, (memoryview(data).nbytes,))


def handoff_route(receiver: int, senders: Sequence[int]) -> Callable[[str], int]:
    """The route of a handoff's channels (``refimpl.api.wire.channels``): ``...>rx`` to the
    receiver's group rank, ``...>tx`` to ``senders[0]``, ``...>tx{r}`` to ``senders[r]``."""

    def route(channel: str) -> int:
        if channel.endswith(">rx"):
            return receiver
        head, sep, tail = channel.rpartition(">tx")
        if sep and (tail == "" or tail.isdigit()) and int(tail or 0) < len(senders):
            return senders[int(tail or 0)]
        raise ValueError(f"channel {channel!r} is not a handoff channel of {len(senders)} ranks")

    return route
