"""Worker processes: started with subprocess (a fresh interpreter each, no fork), each
known by its pid, and always ended by that pid (``Procs.close`` in a ``finally``). A
restart starts a new process under the same worker name; the dead one is kept
(``retired``) so that it is reaped too.

``Boot``: a worker's start, judged by what its process does, not by a fixed time.

A worker process imports torch before its hello: 2.5 s on an idle core, ten times that
on a machine loaded 20 deep (several test sessions beside other jobs), where a fixed
bound failed live workers. So a started process that has not said hello is judged by
its pid (Linux ``/proc/<pid>/stat``), each time the router looks:

- **dead**: its process exited. Named at once, with its exit code (its ``.out`` file
  holds why), whatever time is left;
- **hung**: alive, but for ``STALL_S`` it used no CPU while not waiting for one (state
  ``S`` or stopped: asleep on something that does not come). Named then;
- **slow**: alive and using CPU, or runnable (``R``: waiting for a CPU) or in disk I/O
  (``D``): a loaded machine. It is waited for past the nominal bound (``nominal_s``:
  60 s + 10 s per worker, what a healthy start fits in), up to ``HELLO_MAX_S`` from its
  start, the hard outer bound: past it, it is named as not started in time.

Where ``/proc`` cannot be read (not Linux) a process's progress is unknown: the nominal
bound is the bound, as before. One rule for the first start and a restart (``Router``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from model_checks import children
from refimpl.cluster.worker import WorkerArgs

REPO = Path(__file__).resolve().parents[2]


def free_port(host: str) -> int:
    """A port the OS says is free now (for the torch.distributed TCP init method)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Procs:
    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: list[str] = []
        self.retired: list[subprocess.Popen[bytes]] = []  # dead incarnations' processes

    def start(self, a: WorkerArgs) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        out = open(Path(a.log_dir) / f"{a.log_name}.out", "wb")  # noqa: SIM115 (child owns it)
        old = self.procs.pop(a.name, None)
        if old is not None:  # a restart: the dead incarnation's process stays reaped by pid
            self.retired.append(old)
        try:
            self.procs[a.name] = children.popen(  # its own group, ended with kvown
                [sys.executable, "-m", "refimpl.cluster.worker", a.to_json()],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO),
            )
        finally:
            out.close()

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def exited(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def kill(self, name: str, *, injected: bool = True) -> None:
        """SIGKILL one worker by its pid (``injected``: a fault, listed in ``killed``)."""
        p = self.procs[name]
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        if injected:
            self.killed.append(name)

    def dump_stacks(self) -> None:
        """Every live worker writes its threads' stacks to its .out file (SIGUSR1)."""
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGUSR1)
        time.sleep(0.5)

    def exit_codes(self) -> dict[str, int | None]:
        return {n: p.poll() for n, p in self.procs.items()}

    def close(self, grace_s: float = 5.0) -> None:
        """Wait up to ``grace_s`` for the workers to exit, then SIGKILL each by pid."""
        deadline = time.monotonic() + grace_s
        for p in [*self.retired, *self.procs.values()]:
            left = max(0.0, deadline - time.monotonic())
            try:
                p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGUSR1)  # its stacks go to its .out file
                time.sleep(0.3)
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
            children.release(p)


STALL_S = 30.0  # alive, asleep and no CPU used for this long: hung
HELLO_MAX_S = 600.0  # the hard outer bound on a start, however loaded the machine


class WorkerStartError(RuntimeError):
    """A worker did not start: it died, hung, or passed the outer bound (named in it)."""


def nominal_s(workers: int) -> float:
    """What a healthy start of ``workers`` processes fits in (the bound before #35)."""
    return 60.0 + 10.0 * workers


Probe = Callable[[int], "tuple[str, int] | None"]


def proc_probe(pid: int) -> tuple[str, int] | None:
    """(state letter, CPU clock ticks used) of a process; None where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[11]) + int(fields[12])  # state, utime + stime
    except (OSError, ValueError, IndexError):
        return None


class Boot:
    """The processes started and not yet heard from (their hello), judged by pid."""

    def __init__(self, nominal: float, probe: Probe = proc_probe) -> None:
        self.nominal, self.probe = nominal, probe
        self.started: dict[str, float] = {}  # name -> started at (monotonic)
        self.moved: dict[str, tuple[int, float]] = {}  # name -> (CPU ticks, seen moving at)

    def add(self, name: str, now: float) -> None:
        self.started[name] = now
        self.moved.pop(name, None)

    def forget(self, name: str) -> None:
        """``name`` said hello (or was given up on): no longer judged."""
        self.started.pop(name, None)
        self.moved.pop(name, None)

    def waiting(self) -> set[str]:
        return set(self.started)

    def verdict(self, name: str, proc: subprocess.Popen[bytes], now: float) -> str | None:
        """None while ``name`` may still say hello; else why it will not (one phrase)."""
        age = now - self.started[name]
        rc = proc.poll()
        if rc is not None:
            return f"{name} (pid {proc.pid}) exited with code {rc} before its hello"
        seen = self.probe(proc.pid)
        if seen is None:  # progress unknown: the nominal bound
            if age > self.nominal:
                return f"{name} (pid {proc.pid}) did not say hello within {self.nominal:g} s"
            return None
        state, ticks = seen
        last = self.moved.get(name)
        if last is None or ticks != last[0] or state in ("R", "D"):
            self.moved[name] = (ticks, now)
        elif now - last[1] > STALL_S:
            return (
                f"{name} (pid {proc.pid}) hung before its hello: alive, no CPU used for"
                f" {now - last[1]:.0f} s (state {state})"
            )
        if age > HELLO_MAX_S:
            return f"{name} (pid {proc.pid}) still starting after {HELLO_MAX_S:g} s"
        return None
