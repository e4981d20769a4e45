"""Signals seen when they land, not when Python gets round to its handler.

Python runs a signal handler in the main thread, between two bytecodes: while the main
thread is inside one long C call (a z3 ``check()`` of ``kvown prove --jobs 1``, a blocking
read of a library) the handler does not run at all, so nothing it would arm (the forced
exit of ``kvown_cli.main``) is armed. ``signal.set_wakeup_fd`` makes the C-level handler
write the signal's number to a pipe the moment the signal arrives; ``start`` points it at
a pipe read by a daemon thread, which calls ``on_signal(n)`` (``n``: the SIGINT/SIGTERM/SIGHUP
seen since the last ``reset``), so the bound on an interrupt's end holds whatever the
main thread is in. A forked child (multiprocessing's workers) drops the wakeup fd, so its
own signals never count as its parent's.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

__all__ = ["reset", "start", "watching"]

_COUNTED = (int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGHUP))
_SEEN = [0]
_ON: list[Callable[[int], None]] = []
_STARTED: list[bool] = []
_LOCK = threading.Lock()


def watching() -> bool:
    """The watcher runs: the signals are counted where they land."""
    return bool(_STARTED)


def reset() -> None:
    """A command ended: forget the signals seen and call no one until the next ``start``
    (a signal to a process that ran a command in process, a test runner, is its own)."""
    with _LOCK:
        _SEEN[0] = 0
        _ON.clear()


def _in_child() -> None:
    _STARTED.clear()
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass


def _read(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        for b in data:
            if b not in _COUNTED:
                continue
            with _LOCK:
                _SEEN[0] += 1
                n, on = _SEEN[0], list(_ON)
            for f in on:
                f(n)


def start(on_signal: Callable[[int], None]) -> bool:
    """Count SIGINT/SIGTERM as they land and call ``on_signal(n)`` for each, from a
    daemon thread. From the main thread only; False (nothing changed) where that cannot
    be had: another thread, or a wakeup fd someone else set (asyncio's)."""
    with _LOCK:
        _ON[:] = [on_signal]
    if _STARTED:
        return True
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(r)
        os.close(w)
        return False
    if old != -1:  # someone else's: give it back
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return False
    os.register_at_fork(after_in_child=_in_child)
    _STARTED.append(True)
    threading.Thread(target=_read, args=(r,), name="kvown-signals", daemon=True).start()
    return True
