"""``Link``: the public API's ``Transport`` over the cluster's own two planes.

The cluster's prefill ranks and decode workers are ``refimpl.api`` ``Sender``s (one per
prefill TP rank, ``Sender(..., rank=r)``) and ``Receiver``s (one per decode worker); this
is what carries their conversation (``refimpl.api.wire``) between the processes:

- headers ride the control channel (``control.Channel``: the TCPStore mailboxes, with
  the run's Lamport clock, incarnation fences and control faults), one control message
  per destination and ``flush``, listing ``[channel, header, payload bytes]`` per API
  message (its kind is the API message's type when it carries one, such as ``ready``,
  so that the control faults' drops still name the spec's lost message; ``kv`` else);
- payload bytes ride the pair group with that destination (``pairs.Pairs``, gloo): the
  batch's payloads as one flat uint8 tensor, posted (``isend``) before its control
  message goes out, on a tag the message names. The reader posts its ``irecv`` only when
  that message arrives, so no receive ever waits on a send that will not come (a timed
  out gloo wait closes the pair for good), and it receives every batch, an ended
  attempt's too, so that each posted send completes.

``send`` only queues (the API's ``send`` never blocks); the worker calls ``flush`` after
it logged the events of what it just did, so that a peer's event caused by a message
always sorts after them (the clock a message carries is the one at ``flush``). ``deliver``
files an arrived control message's API messages under their channels (``Inbox``: bounded
and fenced, the one rule of ``refimpl.transport``); ``poll``/``abort``/``fence`` are the
API's. A peer's message is checked before use: a batch that is not a list of
``[str, object, int]`` whose sizes add up, or whose tag is not one ``flush`` gives
(``0 <= tag < RAW_TAG``), is dropped and counted (``stats["malformed"]``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch

from refimpl.checksum import byte_view, copy_bytes_into
from refimpl.cluster.control import Channel, Message
from refimpl.cluster.pairs import Pairs
from refimpl.transport import Inbox, Payload, epoch_of
from refimpl.transport import Message as ApiMessage

RAW_TAG = 1 << 29  # tags of the benchmark's raw transfers (above every batch's tag)
MAX_BATCH_BYTES = 1 << 34


class Link:
    """One process's ``Transport``: ``route(channel)`` names the process it goes to."""

    def __init__(
        self,
        ch: Channel,
        pairs: Pairs,
        route: Callable[[str], str],
        wait: Callable[[Any], bool],
    ) -> None:
        self.ch, self.pairs, self.route, self.wait = ch, pairs, route, wait
        self.stats: Counter[str] = Counter()
        self._inbox: Inbox[ApiMessage] = Inbox(self.stats)
        self._out: dict[str, list[tuple[str, dict[str, Any], Payload]]] = {}
        self._tag: dict[str, int] = {}
        self.posted: list[tuple[Any, torch.Tensor]] = []  # sends whose bytes must live on
        self.bytes_sent = 0

    # ------------------------------------------------------------ Transport
    def send(self, channel: str, header: Mapping[str, Any], payload: Payload = b"") -> None:
        dst = self.route(channel)  # ValueError for a channel that routes nowhere
        h = json.loads(json.dumps(dict(header), allow_nan=False))  # JSON only, now
        self._out.setdefault(dst, []).append((channel, h, payload))

    def poll(self, channel: str) -> list[ApiMessage]:
        return self._inbox.take(channel)

    def abort(self, channel: str) -> int:
        return self._inbox.drop(channel)

    def fence(self, channel: str, epoch: int) -> int:
        return self._inbox.fence(channel, epoch)

    # ------------------------------------------------------------ the planes
    def flush(self) -> None:
        """Send what ``send`` queued: per destination, its payloads (posted), then the
        control message naming them."""
        out, self._out = self._out, {}
        for dst, msgs in out.items():
            sizes = [memoryview(p).nbytes for _, _, p in msgs]
            total, tag = sum(sizes), 0
            if total:
                data = torch.empty(total, dtype=torch.uint8)
                off = 0
                for (_, _, p), n in zip(msgs, sizes, strict=True):
                    if n:
                        copy_bytes_into(data[off : off + n], p)
                    off += n
                tag = self._tag[dst] = self._tag.get(dst, 0) % (RAW_TAG - 1) + 1
                if not self.post(dst, data, tag):  # no pair group with it: it is down
                    self.stats["unsent"] += len(msgs)
                    continue
                self.bytes_sent += total
            first = msgs[0][1]
            kind = str(first.get("type")) if len(msgs) == 1 else "kv"
            rid = base_rid(str(first.get("request_id") or rid_of(msgs[0][0])))
            kv = [[c, h, n] for (c, h, _), n in zip(msgs, sizes, strict=True)]
            self.ch.send(dst, kind, kv=kv, nbytes=total, tag=tag, rid=rid, epoch=epoch_of(first))

    def post(self, dst: str, data: torch.Tensor, tag: int) -> bool:
        """Post one send of ``data`` to ``dst`` on ``tag``; False if there is no pair."""
        try:
            work = self.pairs.isend(dst, data, tag)
        except RuntimeError:
            work = None
        if work is not None:
            self.posted.append((work, data))
        return work is not None

    def retire(self) -> bool:
        """Forget the posted sends that completed (or failed); True if any is left."""
        keep = []
        for work, data in self.posted:
            try:
                done = work.is_completed()
            except RuntimeError:
                continue  # the peer is gone
            if not done:
                keep.append((work, data))
        self.posted = keep
        return bool(keep)

    def deliver(self, m: Message) -> None:
        """File an arrived control message's API messages (receiving its payloads)."""
        kv, total, tag = m.get("kv"), m.get("nbytes"), m.get("tag")
        if not (
            isinstance(kv, list)
            and isinstance(total, int)
            and type(total) is int
            and isinstance(tag, int)
            and type(tag) is int
            and 0 <= tag < RAW_TAG  # a gloo tag past 2^31 raised TypeError out of irecv
            and 0 <= total <= MAX_BATCH_BYTES
            and all(_item_ok(x) for x in kv)
            and sum(x[2] for x in kv) == total
        ):
            self.stats["malformed"] += 1
            return
        buf = torch.empty(total, dtype=torch.uint8)
        if total:
            try:
                work = self.pairs.irecv(str(m.get("src")), buf, tag)
            except RuntimeError:
                work = None
            if work is None or not self.wait(work):
                self.stats["lost"] += len(kv)  # its sender died mid-send: a timeout decides
                return
        off = 0
        for channel, header, n in kv:
            payload: Payload = byte_view(buf[off : off + n]) if n else b""
            off += n
            self._inbox.put(channel, (header, payload), epoch_of(header), n)

    def clear(self) -> None:
        """A restart: nothing queued or filed survives (the old incarnation's)."""
        self._out.clear()
        self._inbox = Inbox(self.stats)


def _item_ok(x: object) -> bool:
    return (
        isinstance(x, list)
        and len(x) == 3
        and isinstance(x[0], str)
        and isinstance(x[1], dict)
        and type(x[2]) is int
        and x[2] >= 0
    )


def rid_of(channel: str) -> str:
    """The request id in an API channel name (``kv:{rid}>rx``, ``kv:{rid}>tx{r}``)."""
    return channel[3:].rpartition(">")[0]


def base_rid(sub: str) -> str:
    """The request of a decode rank's sub-handoff id (``r3@1`` -> ``r3``; else as is)."""
    head, at, d = sub.rpartition("@")
    return head if at and d.isdigit() else sub


def is_link_message(m: Message) -> bool:
    """A control message that carries API messages (``Link.deliver`` takes it)."""
    return "kv" in m


__all__ = ["RAW_TAG", "Link", "base_rid", "is_link_message", "rid_of"]
