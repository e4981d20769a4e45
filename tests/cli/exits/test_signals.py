"""The process-level end of the exit-code contract, run as a user would: a closed pipe
ends quietly with 0, a full disk is one error line (2), and Ctrl-C is one line, exit 130,
with every worker process ended. No timing is asserted: the tests wait for a state (the
workers exist), never for a duration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.exits.exit_helpers import as_a_terminal_gives_it, group

ROOT = Path(__file__).resolve().parents[3]
KVOWN = [sys.executable, "-m", "kvown_cli.main"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_a_closed_pipe_ends_quietly_with_0() -> None:
    p = subprocess.Popen(
        [*KVOWN, "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=ENV
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # what `kvown list | head -1` does
    err = p.stderr.read()
    assert p.wait() == 0 and err == b""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_one_error_line() -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [*KVOWN, "list", "--json"], stdout=full, stderr=subprocess.PIPE, cwd=ROOT, env=ENV
        )
    lines = r.stderr.decode().strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize(
    ("argv", "workers"),
    [
        (("prove", "--jobs", "2"), 2),  # a process pool of z3 workers
        (("check",), 0),
    ],
)
def test_ctrl_c_is_one_line_exit_130_and_no_worker_left(
    argv: tuple[str, ...], workers: int
) -> None:
    p = subprocess.Popen(
        [*KVOWN, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=ENV,
        start_new_session=True,  # its own process group, as a terminal gives it
        preexec_fn=as_a_terminal_gives_it,
    )
    for _ in range(600):  # until the work (and its workers) has started
        if len(group(p.pid)) > workers and p.poll() is None:
            break
        time.sleep(0.1)
    time.sleep(1.0)  # into the work itself, past the imports
    assert p.poll() is None, "finished before it could be interrupted"
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C sends: the whole group
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130
    (line,) = err.decode().strip().splitlines()  # one line: what was done so far, if anything
    assert line.startswith(f"kvown {argv[0]}: interrupted"), line
    assert group(p.pid) == []


# A stand-in for Python 3.11's process-pool manager thread: it notices a worker die and
# itself dies with a traceback (as InvalidStateError does on a cancelled future).
_NOISY_THREAD = """
import multiprocessing, sys, threading, time
from concurrent.futures import InvalidStateError
import kvown_cli.main as m

def work(name, argv, as_json):
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=time.sleep, args=(600,))
    child.start()
    def watch():
        child.join()
        raise InvalidStateError("CANCELLED: <Future state=cancelled>")
    threading.Thread(target=watch).start()
    print("ready", flush=True)
    time.sleep(600)
    return 0

m._dispatch = work
m.entry()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_thread_dying_during_ctrl_c_adds_nothing_to_the_one_line() -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", _NOISY_THREAD, "check"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=ENV,
        start_new_session=True,
        preexec_fn=as_a_terminal_gives_it,
    )
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130
    assert err.decode().strip().splitlines() == ["kvown check: interrupted"]
    assert group(p.pid) == []


def test_a_command_after_an_interrupted_one_in_the_same_process_starts_its_workers() -> None:
    """``end_all`` (an interrupt, or an internal error) stops new work in this process; the
    next command called in it (as the tests and a library user call ``main``) may start
    workers again. Before the fix, the cluster's quick form in the suite was 'interrupted
    after 0/2 requests' and the next cluster test's Popen raised KeyboardInterrupt."""
    from kvown_cli.main import main
    from model_checks import children

    children.end_all()
    assert children.stopping()
    assert main(["list"]) == 0
    assert not children.stopping()
    p = children.popen([sys.executable, "-c", "pass"], stdout=subprocess.DEVNULL)
    try:
        assert p.wait(timeout=60) == 0
    finally:
        children.end_group(p)
