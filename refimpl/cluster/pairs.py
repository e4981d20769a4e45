"""The data plane: one gloo process group per (prefill rank, decode worker) pair and
incarnation pair, so that a restarted worker joins without re-forming a world.

A torch.distributed world cannot take a process back once one of its members died. Each
pair therefore has its own two-member ``ProcessGroupGloo`` (rank 0: the prefill rank,
rank 1: the decode worker), rendezvoused through the router's TCPStore under the prefix
``pg/{p}.{p_inc}-{d}.{d_inc}/``. A restart gives its worker a new incarnation and so
new groups: the dead incarnation's groups are dropped, and a late write of the old
incarnation has no group to land through (the spec's fencing of old registrations, and
``restart_keeps_pool`` is the mutant of reusing one).

Groups are created in one global order, by (prefill rank, decode worker), on both ends,
so concurrent creations never wait on each other in a cycle. Every creation and every
transfer is bounded by a timeout.

Control messages over the data plane: a process's messages to a peer it shares a pair
group with (a prefill rank and a decode process: ``pairs.py``) ride that group on tag 0
instead of the router's TCPStore, so the handoff's hot path (the API's manifest, Ready,
chunks' headers, Ack) costs no store round trip and no doorbell poll.

A message is one frame of ``FRAME`` bytes (an 8-byte length, then the JSON text), and,
when longer, one continuation of exactly the rest, sent right behind it. gloo's
``is_completed`` does not move until a ``wait`` (measured: a frame that arrived still
reads False), so each group has a reader and a writer thread that wait (blocking only
themselves, for days: a timed out gloo wait closes the pair; a dead peer ends the wait
with an error); the worker's loop takes what arrived from a queue and never blocks. The
group belongs to one incarnation pair, so a dead incarnation's frames have no group to
arrive through (its old group is retired at the restart: ``Pairs.forget``).

``control.Channel`` uses this for the peers it can reach (``put``), after its own delays
and drops, and reads what came (``take``) with the strict reader, like a mailbox.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from refimpl.cluster.control import MAX_MESSAGE_BYTES, Store

FRAME = 1 << 14
HEAD = 8
CONTROL_TAG = 0  # the data plane's payloads use tags from 1
FOREVER = timedelta(days=7)  # a control thread waits for its peer's next frame this long


def pair_prefix(p: str, p_inc: int, d: str, d_inc: int) -> str:
    return f"pg/{p}.{p_inc}-{d}.{d_inc}/"


class Pairs:
    """One process's ends of its pair groups, keyed by peer name."""

    def __init__(self, store: Store, me: str, timeout_s: float) -> None:
        self.store, self.me = store, me
        self.prefill = me.startswith("p")
        self.timeout = timedelta(seconds=timeout_s)
        self.groups: dict[str, tuple[int, Any]] = {}  # peer -> (peer_inc, group)
        self.retired: list[Any] = []  # dead incarnations' groups (never destroyed:
        # a gloo destructor may wait on a send to a dead peer)

    def connect(self, my_inc: int, peer: str, peer_inc: int) -> bool:
        """Join the pair group with ``peer``'s incarnation (blocks until it joins, within
        the timeout); False if it did not."""
        old = self.groups.pop(peer, None)
        if old is not None:
            self.retired.append(old[1])
        p, pi, d, di = (
            (self.me, my_inc, peer, peer_inc) if self.prefill else (peer, peer_inc, self.me, my_inc)
        )
        try:
            pg = dist.ProcessGroupGloo(
                dist.PrefixStore(pair_prefix(p, pi, d, di), self.store),  # type: ignore[attr-defined]
                0 if self.prefill else 1,
                2,
                self.timeout,
            )
        except RuntimeError:
            return False
        self.groups[peer] = (peer_inc, pg)
        return True

    def forget(self, peer: str) -> None:
        old = self.groups.pop(peer, None)
        if old is not None:
            self.retired.append(old[1])

    def isend(self, peer: str, data: torch.Tensor, tag: int) -> Any:
        """Post a send to ``peer`` (None: no group with it, it is down)."""
        g = self.groups.get(peer)
        if g is None:
            return None
        return g[1].send([data], 1 if self.prefill else 0, tag)

    def irecv(self, peer: str, buf: torch.Tensor, tag: int) -> Any:
        g = self.groups.get(peer)
        if g is None:
            return None
        return g[1].recv([buf], 1 if self.prefill else 0, tag)


class Frames:
    """One process's control frames over its pair groups (a thread per group and way)."""

    def __init__(self, pairs: Pairs, wait: Callable[[Any], bool]) -> None:
        self.pairs, self.wait = pairs, wait
        self._got: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._send: dict[str, tuple[Any, queue.SimpleQueue[torch.Tensor | None]]] = {}
        self._recv: dict[str, Any] = {}  # peer -> the group its reader thread reads
        self.refused = 0  # frames longer than a message may be (given as b"": refused)

    def reaches(self, peer: str, inc: int) -> bool:
        g = self.pairs.groups.get(peer)
        return g is not None and g[0] == inc

    def put(self, peer: str, inc: int, text: str) -> bool:
        """Queue ``text`` to ``peer``'s incarnation ``inc``; False if no group reaches it."""
        if not self.reaches(peer, inc):
            return False
        self._threads()
        data = text.encode()
        n, first = len(data), min(len(data), FRAME - HEAD)
        head = torch.zeros(FRAME, dtype=torch.uint8)
        head[:HEAD] = torch.tensor(list(n.to_bytes(HEAD, "little")), dtype=torch.uint8)
        head[HEAD : HEAD + first] = torch.frombuffer(bytearray(data[:first]), dtype=torch.uint8)
        q = self._send[peer][1]
        q.put(head)
        if n > first:
            q.put(torch.frombuffer(bytearray(data[first:]), dtype=torch.uint8))
        return True

    def take(self, limit: int = 64) -> list[tuple[str, bytes]]:
        """(peer, text) of the frames that arrived, in order per peer (non-blocking)."""
        self._threads()
        out: list[tuple[str, bytes]] = []
        while len(out) < limit:
            try:
                out.append(self._got.get_nowait())
            except queue.Empty:
                break
        return out

    def _threads(self) -> None:
        """A writer and a reader thread per current group (a new group: new threads; a
        retired group's threads end with its peer, or stay blocked, as daemons)."""
        for peer, (_inc, group) in list(self.pairs.groups.items()):
            if self._recv.get(peer) is not group:
                self._recv[peer] = group
                threading.Thread(target=self._reader, args=(peer, group), daemon=True).start()
            if peer not in self._send or self._send[peer][0] is not group:
                old = self._send.get(peer)
                if old is not None:
                    old[1].put(None)  # the old group's writer ends
                q: queue.SimpleQueue[torch.Tensor | None] = queue.SimpleQueue()
                self._send[peer] = (group, q)
                threading.Thread(target=self._writer, args=(peer, group, q), daemon=True).start()

    def _writer(self, peer: str, group: Any, q: queue.SimpleQueue[torch.Tensor | None]) -> None:
        """Send each frame and wait for it (blocking here only), in order."""
        rank = 1 if self.pairs.prefill else 0
        while (t := q.get()) is not None:
            try:
                group.send([t], rank, CONTROL_TAG).wait(FOREVER)
            except RuntimeError:
                return  # the peer is gone: the router says so

    def _reader(self, peer: str, group: Any) -> None:
        """Receive frame after frame (blocking here only) into the queue ``take`` reads."""
        rank = 1 if self.pairs.prefill else 0
        while True:
            buf = torch.empty(FRAME, dtype=torch.uint8)
            try:
                group.recv([buf], rank, CONTROL_TAG).wait(FOREVER)
                n = int.from_bytes(buf[:HEAD].numpy().tobytes(), "little")
                first = min(n, FRAME - HEAD)
                data = buf[HEAD : HEAD + first].numpy().tobytes()
                if n > MAX_MESSAGE_BYTES:
                    self.refused += 1
                    self._got.put((peer, b""))  # the strict reader refuses it by name
                    return  # what follows on this pair cannot be framed: stop reading it
                if n > first:
                    rest = torch.empty(n - first, dtype=torch.uint8)
                    group.recv([rest], rank, CONTROL_TAG).wait(FOREVER)
                    data += rest.numpy().tobytes()
            except RuntimeError:
                return  # the peer is gone
            self._got.put((peer, data))


__all__ = ["CONTROL_TAG", "FRAME", "Frames", "Pairs", "pair_prefix"]
