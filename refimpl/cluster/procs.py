"""Worker processes: started with subprocess (a fresh interpreter each, no fork), each
known by its pid, and always ended by that pid (``Procs.close`` in a ``finally``). A
restart starts a new process under the same worker name; the dead one is kept
(``retired``) so that it is reaped too."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
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
