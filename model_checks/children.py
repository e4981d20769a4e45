"""The processes and temporary folders a command starts end with it: one discipline for
every ``kvown`` command that starts processes (mutate, fuzz, check --workers, prove,
repro --all, cluster).

- ``popen(argv, ...)`` starts a subprocess in a process group of its own (so a timeout
  or an interrupt ends the process and everything it started: ``end_group``) and
  registers the group with the watchdog.
- ``temp_dir(prefix)`` is a ``TemporaryDirectory`` registered with the watchdog.
- ``install()`` (``kvown``'s main calls it once): every forked child (multiprocessing
  workers: the explorer's, z3's, repro's) gets ``SIGKILL`` when its parent dies
  (``prctl(PR_SET_PDEATHSIG)`` on Linux), ignores SIGINT (its parent ends it) and takes
  SIGTERM at its default.
- ``end_all()`` (the interrupt handler calls it) sets ``stopping()`` (a loop that starts
  work checks it and starts no more), kills every registered group and terminates the
  multiprocessing children.
- ``defer_interrupt()`` (each interrupt handler asks it first): while the main thread is
  inside ``popen``, a child may exist that is not registered yet (``subprocess.Popen``
  waits for the child's exec after the fork: an exception raised there leaves the child
  running, known to no one: a cluster worker outlived its router that way). The handler
  then returns at once, and ``popen`` raises the interrupt itself once the child is
  registered, after ``end_all``.

The watchdog is one small process per command, in its own session, started at the first
``popen`` or ``temp_dir``. It reads the registrations on a pipe whose write end only this
process (and its forks) hold; end of file means they are all gone, however they ended
(SIGKILL included): it then kills every group still registered and removes every folder
still registered, and exits.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
_STOP = threading.Event()
# Reentrant: the interrupt handler (``end_all``) runs in the main thread, which may hold it
# (in ``release``, ``_tell``) when the signal lands; a plain lock hung Ctrl-C there.
_LOCK = threading.RLock()
_GROUPS: dict[int, subprocess.Popen[bytes]] = {}
_WATCHDOG: list[subprocess.Popen[str]] = []
_PIPE: list[IO[str]] = []
_INSTALLED: list[bool] = []
_STARTING = threading.Event()  # the main thread is inside ``popen``
_DEFERRED = threading.Event()  # an interrupt came meanwhile: ``popen`` raises it

_WATCHDOG_SOURCE = """
import json, os, shutil, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
groups, dirs = set(), set()
for line in sys.stdin:
    try:
        op, what = json.loads(line)
    except ValueError:
        continue
    {"+g": groups.add, "-g": groups.discard, "+d": dirs.add, "-d": dirs.discard}[op](what)
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child: receive ``sig`` when the parent dies (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the prctl
        os._exit(1)


def _in_forked_child() -> None:
    global _LOCK
    _LOCK = threading.RLock()  # another thread may have held it at the fork
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends its workers itself
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # multiprocessing's terminate()
    _STOP.clear()
    _STARTING.clear()
    _DEFERRED.clear()
    _GROUPS.clear()  # the parent's registrations are the parent's
    _WATCHDOG.clear()
    _PIPE.clear()


def install() -> None:
    """Once per process: the fork hook (see the module's doc)."""
    if not _INSTALLED:
        os.register_at_fork(after_in_child=_in_forked_child)
        _INSTALLED.append(True)


def begin() -> None:
    """A new command in this process (``kvown_cli.main``; tests call commands in one
    process): work may start again after an earlier command's ``end_all``."""
    _STOP.clear()


def stopping() -> bool:
    """True once ``end_all`` ran: start no more work."""
    return _STOP.is_set()


def _tell(op: str, what: int | str) -> None:
    with _LOCK:
        if not _PIPE:
            dog = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHDOG_SOURCE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the terminal's group leaves it
                text=True,
            )
            assert dog.stdin is not None
            _WATCHDOG.append(dog)
            _PIPE.append(dog.stdin)
        try:
            _PIPE[0].write(json.dumps([op, what]) + "\n")
            _PIPE[0].flush()
        except (OSError, ValueError):
            pass


def defer_interrupt() -> bool:
    """In a signal handler, before it raises: True when the main thread is inside
    ``popen`` (the handler must then return; ``popen`` raises ``KeyboardInterrupt`` once
    its child is registered and every registered group is ended)."""
    if not _STARTING.is_set():
        return False
    _DEFERRED.set()
    return True


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` in a new process group, registered (ended by ``end_all``, by
    the watchdog when this process dies); ``release`` it once reaped. An interrupt that
    comes while it starts is raised here once the child is registered and ended."""
    if _STOP.is_set():
        raise KeyboardInterrupt
    main = threading.current_thread() is threading.main_thread()
    if main:
        _DEFERRED.clear()
        _STARTING.set()
    try:
        p: subprocess.Popen[bytes] = subprocess.Popen(argv, start_new_session=True, **kwargs)
        with _LOCK:
            _GROUPS[p.pid] = p
        _tell("+g", p.pid)
    finally:
        if main:
            _STARTING.clear()
            if _DEFERRED.is_set():
                _DEFERRED.clear()
                end_all()
                raise KeyboardInterrupt
    return p


def release(p: subprocess.Popen[Any]) -> None:
    """``p`` is reaped: forget its group."""
    with _LOCK:
        known = _GROUPS.pop(p.pid, None) is not None
    if known:
        _tell("-g", p.pid)


def end_group(p: subprocess.Popen[Any]) -> None:
    """SIGKILL ``p``'s process group (``p`` and what it started), reap ``p``, release it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    release(p)


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A temporary folder, removed on exit, and by the watchdog if this process dies."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        _tell("+d", d)
        try:
            yield Path(d)
        finally:
            _tell("-d", d)


def end_all() -> None:
    """Stop: no new work, every registered group killed, every multiprocessing child
    terminated (then killed after half a second)."""
    _STOP.set()
    with _LOCK:
        groups = list(_GROUPS)
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except OSError:
            pass
    children = multiprocessing.active_children()
    for c in children:
        c.terminate()
    for c in children:
        c.join(timeout=0.5)
        if c.is_alive():
            c.kill()
