"""A worker process: ``python -m refimpl.cluster.worker '<json>'``.

The JSON (``WorkerArgs``) names the role (``prefill`` or ``decode``), the rank (a
prefill TP rank, or a decode worker's index), the incarnation (0, or the restarts of its
worker so far) and every peer's, the router's TCPStore (control, heartbeats, and the
rendezvous of the pair groups of the data plane: ``pairs.py``), the log directory, the
model, the timeouts and the faults. Nothing else crosses into the process: no pickle.

``Base`` is the part both roles share: the event log and Lamport clock, the control
channel, the heartbeat, the data-plane wait with a timeout, and the exit report
(``bye``: blocks still held and the allocator's ``check_integrity``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from refimpl.cluster.control import Channel, ControlFaults, Message, connect_store, start_heartbeat
from refimpl.cluster.ends import held
from refimpl.cluster.eventlog import ProcLog
from refimpl.cluster.pairs import Frames, Pairs
from refimpl.cluster.workload import ModelSpec
from spec.manifest import MAX_INT_DIGITS
from spec.strict_json import StrictJSONError, loads_object, short

if TYPE_CHECKING:
    from refimpl.blocks import BlockAllocator
    from refimpl.demo.handoff import Worker

ROUTER = "router"
POLL_IDLE_S = 0.001
BEAT_EVERY_S = 0.1
# After the router's "shutdown" a worker may take this many timeouts to finish what is in
# flight before its bye (``Base.begin_close``); the router waits for the byes past it.
CLOSE_WAIT = 4
MAX_ARGS_BYTES = 1 << 20  # the router's arguments to a worker (a few hundred bytes)
RENDEZVOUS_S = 60.0  # a pair group's creation waits this long for a (re)starting peer


@dataclass(frozen=True)
class WorkerArgs:
    role: str  # "prefill" | "decode"
    rank: int  # TP rank within its role
    prefill_tp: int
    decode_tp: int
    store_host: str
    store_port: int
    backend: str  # "gloo"
    log_dir: str
    t0: float  # the router's time origin (for the logs' ``t`` only)
    timeout_s: float  # a peer silent this long is dead; a transfer this long failed
    model: dict[str, Any]
    capacity: int  # blocks per pool
    ready_wait_s: float  # prefill's wait for Ready: decode may have handoffs queued first
    mutant: str | None = None
    faults: dict[str, Any] = field(default_factory=dict)
    decode_workers: int = 1
    inc: int = 0  # this worker's incarnation (its restarts so far)
    incs: dict[str, int] = field(default_factory=dict)  # peers' current incarnations
    lc0: int = 0  # a restarted incarnation's clock starts past the router's EnvRestart
    drank: int = 0  # a decode process's TP rank within its worker (0: the worker's leader)
    frames: bool = True  # control to a pair-group peer over that group (frames.py)

    @property
    def name(self) -> str:
        return proc_name(self.role, self.rank, self.drank)

    @property
    def log_name(self) -> str:
        """The event log's process name: ``d0``, or ``d0.1`` for incarnation 1."""
        return self.name if self.inc == 0 else f"{self.name}.{self.inc}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerArgs:
        """The router's arguments, read by the one strict reader (``loads_object``): an
        unknown or missing field is a StrictJSONError naming it, like malformed JSON."""
        d = loads_object(
            text, prefix="worker arguments", max_bytes=MAX_ARGS_BYTES, max_depth=8,
            max_int_digits=MAX_INT_DIGITS, what="worker arguments",
        )  # fmt: skip
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise StrictJSONError(f"worker arguments: unknown field {short(unknown[0])}")
        missing = [f.name for f in fields(cls) if f.name not in d and _required(f)]
        if missing:
            raise StrictJSONError(f"worker arguments: missing field {missing[0]!r}")
        return cls(**d)


def _required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def proc_name(role: str, rank: int, drank: int = 0) -> str:
    """p0, p1, ..., d0 (decode worker 0, its rank 0), d0r1 (its decode rank 1)."""
    return f"{role[0]}{rank}" + (f"r{drank}" if drank else "")


def parse_proc(name: str) -> tuple[str, int, int]:
    """(role, rank, decode rank) of a process name (``proc_name``'s inverse)."""
    role = "prefill" if name.startswith("p") else "decode"
    head, _, dr = name[1:].partition("r")
    return role, int(head), int(dr or 0)


def worker_of(name: str) -> str:
    """A decode process's worker (``d0r1`` -> ``d0``); a prefill rank's own name."""
    return name.partition("r")[0] if name.startswith("d") else name


def decode_procs(workers: int, tp: int) -> list[str]:
    """Every decode process: each worker's ranks, the leader (rank 0) first."""
    return [proc_name("decode", k, j) for k in range(workers) for j in range(tp)]


def peers_of(a: WorkerArgs) -> tuple[str, ...]:
    """Who may send to this process: the router; a prefill rank hears the other ranks
    (the leader's control, a sibling's group messages) and every decode process (each
    decode rank answers the prefill ranks it hears from); a decode process hears every
    prefill rank and the other ranks of its own worker (group messages, the leader's
    attention requests; decode workers never talk to each other)."""
    if a.role == "decode":
        own = [proc_name("decode", a.rank, j) for j in range(a.decode_tp)]
        names = [ROUTER, *prefill_names(a.prefill_tp), *own]
    else:
        names = [ROUTER, *prefill_names(a.prefill_tp), *decode_procs(a.decode_workers, a.decode_tp)]
    return tuple(n for n in names if n != a.name)


def prefill_names(tp: int) -> list[str]:
    return [f"p{r}" for r in range(tp)]


def decode_names(n: int) -> list[str]:
    return [f"d{k}" for k in range(n)]


class Base:
    """What a prefill rank and a decode worker share."""

    w: Worker  # the role's model pools (``ends``)

    def __init__(self, a: WorkerArgs) -> None:
        self.a = a
        self.spec = ModelSpec(**a.model)
        self.log = ProcLog(a.log_dir, a.log_name, a.t0)
        self.log.clock(a.lc0)
        self.store = connect_store(a.store_host, a.store_port, a.timeout_s)
        faults = ControlFaults(
            **{**a.faults, "droppable": frozenset(a.faults.get("droppable", ()))}
        )
        self.ch = Channel(
            self.store, a.name, peers_of(a), self.log.clock, faults, inc=a.inc, incs=dict(a.incs)
        )
        self.timeout = timedelta(seconds=a.timeout_s)
        self.stop = False
        self.closing: float | None = None  # when the bye is due at the latest (``begin_close``)
        start_heartbeat(a.store_host, a.store_port, a.name, BEAT_EVERY_S, a.timeout_s)
        self.backlog: list[Message] = []  # read while waiting for one reply, handled next
        self.dead: set[str] = set()  # peers the router declared dead
        self.seen: set[int] = set()  # crashes this process has heard of
        rendezvous = connect_store(a.store_host, a.store_port, RENDEZVOUS_S)
        self.pairs = Pairs(rendezvous, a.name, RENDEZVOUS_S)
        if a.frames:
            self.ch.side = Frames(self.pairs, self.wait)
        others = (
            decode_procs(a.decode_workers, a.decode_tp)
            if a.role == "prefill"
            else prefill_names(a.prefill_tp)
        )
        self.data_peers = others

    def learned(self, m: Message) -> None:
        """A notice of a crash (``m["crash"]``: the router's EnvCrash) is handled here:
        the ``CrashSeen`` marker splits this process's events into those before it and
        those that causally follow the crash (``eventlog.per_request`` places the crash
        in each request's log by it). Not a spec action: no request's log shows it."""
        if "crash" in m and m["crash"] not in self.seen:
            self.seen.add(m["crash"])
            self.event("CrashSeen", None, crash=int(m["crash"]))

    def connect_all(self) -> None:
        """Join a pair group with every data peer, in the global (prefill, decode) order."""
        for peer in self.data_peers:
            if peer not in self.dead:
                self.pairs.connect(self.ch.inc, peer, self.ch.incs.get(peer, 0))

    def on_restarted(self, m: Message) -> None:
        """The router restarted a worker: ``who`` are its processes, now ``inc``. A
        survivor of that worker takes the new incarnation itself; a peer fences the old
        one's mailboxes and groups and joins the new one's."""
        who, inc = list(m["who"]), int(m["inc"])
        if self.a.name in who:
            self.ch.set_own_inc(inc)
            for w in who:
                if w != self.a.name:
                    self.ch.set_inc(w, inc)
            self.restart_self(inc)
            self.connect_all()
            return
        for w in who:
            self.ch.set_inc(w, inc)
            self.dead.discard(w)
            self.pairs.forget(w)
        for w in sorted(x for x in who if x in self.data_peers):
            self.pairs.connect(self.ch.inc, w, inc)

    def restart_self(self, inc: int) -> None:
        """A surviving process of a restarted worker starts over (pools empty)."""

    def now(self) -> float:
        return time.time()

    def event(self, action: str, rid: str | None, **kw: Any) -> None:
        self.log.event(action, rid, self.now(), **kw)

    def wait(self, work: Any) -> bool:
        """Wait for a point-to-point op; False if it failed or timed out (a dead peer)."""
        try:
            ok = work.wait(self.timeout)
        except RuntimeError:
            return False
        return ok is not False

    def report(self, kind: str, **body: Any) -> None:
        self.ch.send(ROUTER, kind, **body)

    def loop(self) -> None:
        while not self.stop:
            msgs, self.backlog = self.backlog + self.ch.poll(), []
            msgs.sort(key=lambda m: m.get("kind") == "shutdown")  # what came with it first
            for m in msgs:
                self.handle(m)
            busy = self.step()
            if self.closing is not None and (self.settled() or self.now() >= self.closing):
                self.close()
            elif not msgs and not busy:
                time.sleep(POLL_IDLE_S)

    def begin_close(self, waits: float) -> None:
        """The router's "shutdown": the loop goes on until nothing is in flight here
        (``settled``: an Ack or a sibling's drop may still be on its way, delayed), at most
        ``waits`` timeouts, then ``close`` (issue #34: the bye came first, and a rank
        reported the last request's blocks, whose drop was still delayed, as leaked)."""
        if self.closing is None:
            self.closing = self.now() + waits * self.a.timeout_s

    @property
    def alloc(self) -> BlockAllocator:
        return self.w.rp.alloc

    def settled(self) -> bool:
        """Nothing in flight on this worker: it may say bye (``begin_close``)."""
        return True

    def close(self) -> None:
        """The bye: the allocator's integrity and the blocks it still holds."""
        integrity: str | None = None
        try:
            self.alloc.check_integrity()
        except Exception as e:  # noqa: BLE001 (reported to the router as text)
            integrity = str(e)
        self.bye(held(self.alloc), integrity)

    def handle(self, m: Message) -> None:
        raise NotImplementedError

    def step(self) -> bool:
        """Work not driven by a message (timeouts, decode steps); True if it did any."""
        return False

    def on_shutdown(self, m: Message) -> None:
        """The router ends the run. A decode rank's own timeouts end what it holds: its
        bye is at once (``close`` after this loop turn, the messages that came with the
        shutdown handled first); a prefill rank drains first (``PrefillWorker``)."""
        self.begin_close(0)

    def bye(self, held: int, integrity: str | None) -> None:
        self.report(
            "bye", held=held, integrity=integrity, lc=self.log.lc,
            delayed=self.ch.delayed, dropped=self.ch.dropped, fenced=self.ch.fenced,
        )  # fmt: skip
        self.ch.drain(self.a.timeout_s)  # a delayed bye must still go out
        self.stop = True


def main(argv: list[str]) -> int:
    try:
        a = WorkerArgs.from_json(argv[1] if len(argv) > 1 else "")
    except StrictJSONError as e:
        print(f"kvown worker: {e}", file=sys.stderr)
        return 2
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack
    torch.set_num_threads(1)
    w: Base
    if a.role == "prefill":
        from refimpl.cluster.prefill import PrefillWorker

        w = PrefillWorker(a)
    else:
        from refimpl.cluster.decode import DecodeWorker

        w = DecodeWorker(a)
    w.report("hello")
    w.ch.drain(a.timeout_s)  # a delayed hello must be out before the rendezvous blocks
    w.connect_all()
    w.report("connected")
    w.loop()
    w.log.close()
    return 0


if __name__ == "__main__":
    rc = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: gloo's destructors may wait on a send to a dead peer. The
    # log is closed and the bye is out, so nothing is left to lose.
    os._exit(rc)
