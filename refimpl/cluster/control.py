"""The control channel: JSON messages through torch.distributed's TCPStore.

Every pair of process incarnations (src, dst) has its own mailbox, written by src only:

    key  ctl/{src}.{src_inc}>{dst}.{dst_inc}/{seq}   value  one JSON object (seq from 1)

A restarted worker is a new incarnation (``inc + 1``, spec ``EnvRestart``): it reads
and writes new mailboxes, so a message of (or to) the dead incarnation is never taken as
current. When told of a peer's restart (``Channel.set_inc``), a reader discards what is
left in the old incarnation's mailbox, counted in ``fenced`` (spec ``PrefillDiscard`` /
``DecodeDiscard``: a control message of an older incarnation changes nothing).

Each send also rings the receiver's doorbell (``n/{dst}.{dst_inc}``, a counter set
after the message): a reader whose doorbell has not moved reads nothing, in one round
trip. A reader keeps one cursor per peer and asks ``check([next key])`` (a non-blocking
round trip) before it reads, so a dead writer never hangs it: its mailbox just stops
growing. Nothing waits without a timeout; the store's own timeout bounds every call.

Each message carries the sender's Lamport clock (``lc``); ``Channel.poll`` advances the
receiver's clock past it, which is how the merged event log is ordered by causality.

A message is read by ``read_message`` (``spec.strict_json.loads_strict``, the project's one
reader of untrusted JSON, under ``MAX_MESSAGE_BYTES`` and ``MAX_MESSAGE_DEPTH``; then an
object with a string ``kind`` and an int ``lc``): a peer's malformed message is taken out
of its mailbox, counted in ``malformed`` with its reason kept (the last
``KEEP_REFUSALS``), and the channel goes on serving; it never raises out of ``poll``.

Faults (``ControlFaults``): a message may be held back for ``delay_s`` (sent later, by
``flush``, from the same loop; later messages to the same peer wait behind it, as on a
slow TCP link, so each pair stays FIFO) or dropped. Only the kinds named in ``droppable`` can be
dropped: the router picks them so that a drop stays inside what the protocol recovers
from by a timeout (see ``refimpl/cluster/faults.py``). Whether a message is dropped is a
hash of the seed, its kind, request and epoch (``drops``), not a draw in send order, so
the same seed drops the same messages whatever the processes' timing.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
import xxhash

from spec.manifest import MAX_INT_DIGITS, MAX_JSON_CHARS, MAX_JSON_DEPTH
from spec.strict_json import StrictJSONError, loads_object

Store = Any  # torch.distributed.TCPStore (torch's stubs do not export it)

Message = dict[str, Any]

# A message holds at most one manifest (capped at MAX_JSON_CHARS) and a few short fields.
MAX_MESSAGE_BYTES = MAX_JSON_CHARS + (1 << 16)
# The message, its ``kv`` list, an item ``[channel, header, n]``, the API header, then the
# header's manifest (MAX_JSON_DEPTH); or a list of lists (``raw`` sizes).
MAX_MESSAGE_DEPTH = MAX_JSON_DEPTH + 4
MAX_LC = 1 << 62  # a Lamport clock past this is a peer's garbage, not a count of events
KEEP_REFUSALS = 16  # reasons of malformed messages kept (``Channel.refused``)


def read_message(raw: bytes | str) -> Message:
    """One control message from a peer's bytes; ``StrictJSONError`` naming what is wrong
    (too long, too deep, a duplicate key, a non-finite number, not an object, no string
    ``kind``, no int ``lc`` in [0, MAX_LC))."""
    msg = loads_object(
        raw, prefix="control message", max_bytes=MAX_MESSAGE_BYTES,
        max_depth=MAX_MESSAGE_DEPTH, max_int_digits=MAX_INT_DIGITS, what="control message",
    )  # fmt: skip
    if not isinstance(msg.get("kind"), str):
        raise StrictJSONError("control message: no string 'kind'")
    lc = msg.get("lc", 0)
    if type(lc) is not int or not 0 <= lc < MAX_LC:
        raise StrictJSONError(f"control message: 'lc' is not an int in [0, {MAX_LC})")
    return msg


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

    def drops(self, kind: str, body: dict[str, Any]) -> bool:
        """Is this message dropped? A function of (seed, kind, rid, epoch) only."""
        if kind not in self.droppable or not self.drop_p:
            return False
        key = f"{self.seed}/{kind}/{body.get('rid')}/{body.get('epoch')}".encode()
        return xxhash.xxh64_intdigest(key) / 2.0**64 < self.drop_p


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
    inc: int = 0  # this process's incarnation
    incs: dict[str, int] = field(default_factory=dict)  # each peer's current incarnation
    sent: dict[str, int] = field(default_factory=dict)  # mailbox -> last seq
    cursor: dict[str, int] = field(default_factory=dict)  # mailbox -> last seq read
    held: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # box -> (due, json)
    dropped: int = 0
    delayed: int = 0
    fenced: int = 0  # messages of a dead incarnation, discarded unread
    malformed: int = 0  # messages ``read_message`` refused, taken out unread
    refused: list[str] = field(default_factory=list)  # their reasons, the last few
    rung: int = 0  # the doorbell's count when this end last read everything
    side: Any = None  # ``pairs.Frames``: the peers it reaches go over the data plane

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.faults.seed}/{self.name}")

    def box(self, src: str, src_inc: int, dst: str, dst_inc: int) -> str:
        return f"ctl/{src}.{src_inc}>{dst}.{dst_inc}"

    def send(self, dst: str, kind: str, *, to_inc: int | None = None, **body: Any) -> None:
        """Queue a message to ``dst``'s current incarnation (or ``to_inc``)."""
        msg = {"kind": kind, "src": self.name, "inc": self.inc, "lc": self.clock(0), **body}
        text = json.dumps(msg, allow_nan=False, separators=(",", ":"))
        f = self.faults
        if f.drops(kind, body):
            self.dropped += 1
            return
        dinc = self.incs.get(dst, 0) if to_inc is None else to_inc
        dst = self.box(self.name, self.inc, dst, dinc)
        due = time.monotonic()
        if f.delay_p and self.rng.random() < f.delay_p:
            self.delayed += 1
            due += f.delay_s
        queue = self.held.setdefault(dst, [])
        if queue:  # a slow link stays FIFO: nothing overtakes a held message
            due = max(due, queue[-1][0])
        queue.append((due, text))
        self.flush()

    def _put(self, box: str, text: str) -> None:
        dst, _, dinc = box.split(">")[1].rpartition(".")
        if self.side is not None and self.side.put(dst, int(dinc), text):
            return  # a frame over the pair group with that incarnation (pairs.Frames)
        seq = self.sent.get(box, 0) + 1
        self.store.set(f"{box}/{seq}", text)
        self.store.add(f"n/{box.split('>')[1]}", 1)  # the receiver's doorbell, after the set
        self.sent[box] = seq

    def set_inc(self, peer: str, inc: int) -> None:
        """``peer`` is now incarnation ``inc``: what is left from its old one is fenced."""
        old = self.incs.get(peer, 0)
        if inc == old:
            return
        self.fenced += len(self._read(self.box(peer, old, self.name, self.inc), 1 << 30))
        self.incs[peer] = inc

    def set_own_inc(self, inc: int) -> None:
        """This process restarts its worker as incarnation ``inc`` (a survivor of a
        crashed TP worker): messages to the old incarnation are fenced; held ones go."""
        for peer in self.peers:
            box = self.box(peer, self.incs.get(peer, 0), self.name, self.inc)
            self.fenced += len(self._read(box, 1 << 30))
        self.held.clear()
        self.inc = inc

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
        framed: list[Message] = []
        if peers is None and self.side is not None:
            for src, raw in self.side.take(limit):
                framed += self._read_one(f"frame from {src}", raw)
        bell = 0
        if peers is None:  # one round trip when nothing came (the usual case)
            bell = int(self.store.add(f"n/{self.name}.{self.inc}", 0))
            if bell == self.rung:
                return framed
        out: list[Message] = framed
        taken = 0  # malformed ones count too: a flood of junk cannot stretch one poll
        for src in self.peers if peers is None else peers:
            box = self.box(src, self.incs.get(src, 0), self.name, self.inc)
            got, n = self._take(box, limit - taken)
            out += got
            taken += n
        if peers is None and taken < limit:  # everything counted in ``bell`` is read
            self.rung = bell
        return out

    def _read(self, box: str, limit: int) -> list[Message]:
        return self._take(box, limit)[0]

    def _take(self, box: str, limit: int) -> tuple[list[Message], int]:
        """Up to ``limit`` keys of ``box`` taken out: the well-formed messages, and how
        many keys were taken (malformed ones too)."""
        out: list[Message] = []
        taken = 0
        while taken < limit:
            nxt = self.cursor.get(box, 0) + 1
            key = f"{box}/{nxt}"
            if not self.store.check([key]):
                break
            raw = self.store.get(key)
            self.store.delete_key(key)
            self.cursor[box] = nxt
            taken += 1
            out += self._read_one(key, raw)
        return out, taken

    def _read_one(self, where: str, raw: bytes | str) -> list[Message]:
        """The message in ``raw`` (its clock merged), or none: refused and counted."""
        try:
            msg = read_message(raw)
        except StrictJSONError as e:
            self.malformed += 1
            self.refused = [*self.refused[1 - KEEP_REFUSALS :], f"{where}: {e}"]
            return []
        self.clock(msg.get("lc", 0))
        return [msg]


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


MAX_LOAD_FACTOR = 20.0


def runnable_now() -> int:
    """Threads runnable on the machine at this instant (``/proc/loadavg``'s 4th field, this
    reader excluded); 0 where it cannot be read."""
    try:
        return max(0, int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return 0


def load_factor() -> float:
    """How many times over this machine's CPUs are asked for (1.0 when it is not loaded;
    otherwise the larger of the 1-minute load average and the threads runnable now, per
    CPU, at most ``MAX_LOAD_FACTOR``). The router scales a heartbeat's timeout by it: on a
    loaded machine a live worker's beat thread waits for a CPU, and was declared dead
    (``kvown cluster`` on 2 busy cores exited 1 with no kill injected). The load average
    alone lags a sudden load by a minute (a hog started 3 s ago adds 5% of itself to
    it): the runnable count sees it at once. A worker that exits is still seen at once
    (its process is gone)."""
    try:
        load = max(os.getloadavg()[0], float(runnable_now()))
    except OSError:
        return 1.0
    return min(MAX_LOAD_FACTOR, max(1.0, load / (os.cpu_count() or 1)))


def heartbeats(store: Store, names: Iterable[str]) -> dict[str, int]:
    return {n: store.add(f"hb/{n}", 0) for n in names}
