"""The control channel: JSON messages through torch.distributed's TCPStore.

Every pair of processes (src, dst) has its own mailbox, written by src only:

    key  ctl/{src}>{dst}/{seq}   value  one JSON object (seq counts from 1, no holes)

A reader keeps one cursor per peer and asks ``check([next key])`` (a non-blocking
round trip) before it reads, so a dead writer never hangs it: its mailbox just stops
growing. Nothing waits without a timeout; the store's own timeout bounds every call.

Each message carries the sender's Lamport clock (``lc``); ``Channel.poll`` advances the
receiver's clock past it, which is how the merged event log is ordered by causality.

Faults (``ControlFaults``): a message may be held back for ``delay_s`` (sent later, by
``flush``, from the same loop; later messages to the same peer wait behind it, as on a
slow TCP link, so each pair stays FIFO) or dropped. Only the kinds named in ``droppable`` can be
dropped: the router picks them so that a drop stays inside what the protocol recovers
from by a timeout (see ``refimpl/cluster/faults.py``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

Store = Any  # torch.distributed.TCPStore (torch's stubs do not export it)

Message = dict[str, Any]


@dataclass(frozen=True)
class ControlFaults:
    """Delays and drops applied by the sender."""

    delay_p: float = 0.0  # probability that a message is held back
    delay_s: float = 0.0  # for how long
    drop_p: float = 0.0  # probability that a droppable message is never sent
    droppable: frozenset[str] = frozenset()  # message kinds that may be dropped
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("delay_p", "drop_p"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}={v} not in [0, 1]")
        if self.delay_s < 0:
            raise ValueError(f"delay_s={self.delay_s} < 0")


def connect_store(host: str, port: int, timeout_s: float) -> Store:
    """A client of the router's store; every call on it gives up after ``timeout_s``."""
    return dist.TCPStore(  # type: ignore[attr-defined]
        host, port, is_master=False, timeout=timedelta(seconds=timeout_s), use_libuv=False
    )


def serve_store(host: str, timeout_s: float) -> Store:
    """The router's store (port chosen by the OS: read ``.port``)."""
    return dist.TCPStore(  # type: ignore[attr-defined]
        host,
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
        use_libuv=False,
    )


@dataclass
class Channel:
    """One process's end: send to any peer, poll every peer's mailbox to it."""

    store: Store
    name: str
    peers: tuple[str, ...]
    clock: Callable[[int], int]  # merges a received lc, returns the local lc to stamp
    faults: ControlFaults = field(default_factory=ControlFaults)
    sent: dict[str, int] = field(default_factory=dict)
    cursor: dict[str, int] = field(default_factory=dict)
    held: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # dst -> (due, json)
    dropped: int = 0
    delayed: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.faults.seed}/{self.name}")

    def send(self, dst: str, kind: str, **body: Any) -> None:
        msg = {"kind": kind, "src": self.name, "lc": self.clock(0), **body}
        text = json.dumps(msg, separators=(",", ":"))
        f = self.faults
        if kind in f.droppable and f.drop_p and self.rng.random() < f.drop_p:
            self.dropped += 1
            return
        due = time.monotonic()
        if f.delay_p and self.rng.random() < f.delay_p:
            self.delayed += 1
            due += f.delay_s
        queue = self.held.setdefault(dst, [])
        if queue:  # a slow link stays FIFO: nothing overtakes a held message
            due = max(due, queue[-1][0])
        queue.append((due, text))
        self.flush()

    def _put(self, dst: str, text: str) -> None:
        seq = self.sent.get(dst, 0) + 1
        self.store.set(f"ctl/{self.name}>{dst}/{seq}", text)
        self.sent[dst] = seq

    def flush(self) -> None:
        """Send every held message that is due, in order, per destination."""
        now = time.monotonic()
        for dst, queue in self.held.items():
            while queue and queue[0][0] <= now:
                self._put(dst, queue.pop(0)[1])

    def drain(self, timeout_s: float) -> None:
        """Send everything still held (at its due time), for at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while any(self.held.values()) and time.monotonic() < deadline:
            self.flush()
            time.sleep(0.001)

    def poll(self, peers: Iterable[str] | None = None, limit: int = 64) -> list[Message]:
        """Every message that has arrived, in per-sender order (non-blocking)."""
        self.flush()
        out: list[Message] = []
        for src in self.peers if peers is None else peers:
            while len(out) < limit:
                nxt = self.cursor.get(src, 0) + 1
                key = f"ctl/{src}>{self.name}/{nxt}"
                if not self.store.check([key]):
                    break
                msg = json.loads(self.store.get(key))
                self.store.delete_key(key)
                self.cursor[src] = nxt
                self.clock(int(msg.get("lc", 0)))
                out.append(msg)
        return out


def beat(store: Store, name: str) -> None:
    """A liveness heartbeat: one counter per process, read by the router."""
    store.add(f"hb/{name}", 1)


def start_heartbeat(host: str, port: int, name: str, every_s: float, timeout_s: float) -> None:
    """Beat from a daemon thread on its own store connection, so that a long (bounded)
    wait on the data plane never looks like death. It stops when the process does."""

    def run() -> None:
        store = connect_store(host, port, timeout_s)
        while True:
            try:
                beat(store, name)
            except RuntimeError:
                return  # the router's store is gone: the run is over
            time.sleep(every_s)

    threading.Thread(target=run, name=f"heartbeat-{name}", daemon=True).start()


def heartbeats(store: Store, names: Iterable[str]) -> dict[str, int]:
    return {n: store.add(f"hb/{n}", 0) for n in names}
