"""A worker process: ``python -m refimpl.cluster.worker '<json>'``.

The JSON (``WorkerArgs``) names the role (``prefill`` or ``decode``), the TP rank, the
torch.distributed world (a TCP init method: another host joins by this address), the
router's TCPStore, the log directory, the model, the timeouts and the faults. Nothing
else crosses into the process: no pickle.

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
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from refimpl.cluster.control import Channel, ControlFaults, Message, connect_store, start_heartbeat
from refimpl.cluster.eventlog import ProcLog
from refimpl.cluster.workload import ModelSpec

ROUTER = "router"
POLL_IDLE_S = 0.001
BEAT_EVERY_S = 0.1


@dataclass(frozen=True)
class WorkerArgs:
    role: str  # "prefill" | "decode"
    rank: int  # TP rank within its role
    prefill_tp: int
    decode_tp: int
    store_host: str
    store_port: int
    init_method: str  # torch.distributed TCP init method, tcp://host:port
    backend: str  # "gloo" | "nccl"
    log_dir: str
    t0: float  # the router's time origin (for the logs' ``t`` only)
    timeout_s: float  # a peer silent this long is dead; a transfer this long failed
    model: dict[str, Any]
    capacity: int  # blocks per pool
    ready_wait_s: float  # prefill's wait for Ready: decode may have handoffs queued first
    mutant: str | None = None
    faults: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return proc_name(self.role, self.rank)

    @property
    def world_rank(self) -> int:
        return self.rank if self.role == "prefill" else self.prefill_tp + self.rank

    @property
    def world_size(self) -> int:
        return self.prefill_tp + self.decode_tp

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerArgs:
        return cls(**json.loads(text))


def proc_name(role: str, rank: int) -> str:
    return f"{role[0]}{rank}"  # p0, p1, ..., d0


def peers_of(a: WorkerArgs) -> tuple[str, ...]:
    names = (
        [ROUTER] + [f"p{r}" for r in range(a.prefill_tp)] + [f"d{r}" for r in range(a.decode_tp)]
    )
    return tuple(n for n in names if n != a.name)


class Base:
    """What a prefill rank and a decode worker share."""

    def __init__(self, a: WorkerArgs) -> None:
        self.a = a
        self.spec = ModelSpec(**a.model)
        self.log = ProcLog(a.log_dir, a.name, a.t0)
        self.store = connect_store(a.store_host, a.store_port, a.timeout_s)
        faults = ControlFaults(
            **{**a.faults, "droppable": frozenset(a.faults.get("droppable", ()))}
        )
        self.ch = Channel(self.store, a.name, peers_of(a), self.log.clock, faults)
        self.timeout = timedelta(seconds=a.timeout_s)
        self.stop = False
        start_heartbeat(a.store_host, a.store_port, a.name, BEAT_EVERY_S, a.timeout_s)
        self.dead: set[str] = set()  # peers the router declared dead

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
            msgs = self.ch.poll()
            for m in msgs:
                self.handle(m)
            busy = self.step()
            if not msgs and not busy:
                time.sleep(POLL_IDLE_S)

    def handle(self, m: Message) -> None:
        raise NotImplementedError

    def step(self) -> bool:
        """Work not driven by a message (timeouts, decode steps); True if it did any."""
        return False

    def bye(self, held: int, integrity: str | None) -> None:
        self.report(
            "bye", held=held, integrity=integrity, lc=self.log.lc,
            delayed=self.ch.delayed, dropped=self.ch.dropped,
        )  # fmt: skip
        self.ch.drain(self.a.timeout_s)  # a delayed bye must still go out
        self.stop = True


def main(argv: list[str]) -> int:
    a = WorkerArgs.from_json(argv[1])
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack
    torch.set_num_threads(1)
    dist.init_process_group(
        a.backend,
        init_method=a.init_method,
        rank=a.world_rank,
        world_size=a.world_size,
        timeout=timedelta(seconds=max(30.0, a.timeout_s)),
    )
    w: Base
    if a.role == "prefill":
        from refimpl.cluster.prefill import PrefillWorker

        w = PrefillWorker(a)
    else:
        from refimpl.cluster.decode import DecodeWorker

        w = DecodeWorker(a)
    w.report("hello")
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
