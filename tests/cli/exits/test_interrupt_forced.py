"""Ctrl-C keeps its bound even when the command's own way out does not come (issue #35):
a command that swallows the KeyboardInterrupt (as a library's ``except BaseException``
loop or a C call that never returns would) still exits 130 with its one line, after
``main.FORCE_S``; a second Ctrl-C ends it at once. Without the forced exit both hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX signals")

STUCK = textwrap.dedent(
    """
    import sys, time
    from kvown_cli import main

    class Stuck:
        @staticmethod
        def add_arguments(parser):
            pass

        @staticmethod
        def run(args):
            said = False
            while True:  # swallows every interrupt
                try:
                    if not said:
                        said = True
                        print("stuck: running", file=sys.stderr, flush=True)
                    time.sleep(60)
                except KeyboardInterrupt:
                    print("stuck: swallowed", flush=True)  # stdout: the handler mutes fd 2

    sys.modules["stuck_cmd"] = Stuck
    main.COMMANDS["stuck"] = ("stuck_cmd", "a command that ignores Ctrl-C")
    sys.argv = ["kvown", "stuck"]
    main.entry()
    """
)


def _start(source: str = STUCK) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", source],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupt(times: int) -> list[str]:
    p = _start()
    try:
        assert p.stderr is not None and p.stdout is not None
        assert p.stderr.readline().strip() == "stuck: running"
        for i in range(times):  # each after the last one was swallowed
            os.kill(p.pid, signal.SIGINT)
            if i < times - 1:
                assert p.stdout.readline().strip() == "stuck: swallowed"
        p.wait(timeout=60)  # a bound on a hang, not a timing
        lines = p.stderr.read().splitlines()
        assert p.returncode == 130, lines
        return lines
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_a_swallowed_interrupt_still_ends_the_command() -> None:
    assert _interrupt(1) == ["kvown stuck: interrupted"]


def test_a_second_interrupt_ends_it_at_once() -> None:
    assert _interrupt(2) == ["kvown stuck: interrupted"]


# One z3 check() that runs for minutes (the pigeonhole principle, 14 pigeons in 13 holes:
# z3 takes about 2 s at 10, 6 s at 11, and grows several-fold per pigeon): one C call
# (ctypes releases the GIL) in which Python runs no signal handler.
PIGEONS = """
import z3
n = 14
s = z3.Solver()
p = [[z3.Bool(f"p{i}_{j}") for j in range(n - 1)] for i in range(n)]
for i in range(n):
    s.add(z3.Or(p[i]))
for j in range(n - 1):
    for i in range(n):
        for k in range(i + 1, n):
            s.add(z3.Not(z3.And(p[i][j], p[k][j])))
"""
IN_C = STUCK.replace("time.sleep(60)", "s.check()  # the main thread in one C call").replace(
    "sys.modules[", PIGEONS + "sys.modules[", 1
)


def test_an_interrupt_during_a_c_call_still_ends_the_command() -> None:
    """Python runs no handler while the main thread is inside one C call (z3's check() in
    ``kvown prove --jobs 1``): the signal is still seen as it lands (``interrupt.watch``),
    so the forced exit ends the command; without the watcher it ran the check out (minutes)."""
    p = _start(IN_C)
    try:
        assert p.stderr is not None
        assert p.stderr.readline().strip() == "stuck: running"
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=60)  # a bound on a hang, not a timing
        assert p.returncode == 130
        assert p.stderr.read().splitlines() == ["kvown stuck: interrupted"]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
