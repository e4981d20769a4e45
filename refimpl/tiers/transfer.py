"""``Transfer``: an asynchronous tier copy the engine polls, waits on or cancels.

    t = reload_async(tier, None, device, geo, "req-1", token_ids)   # the I/O starts
    while not t.poll(): ...          # the engine's step: True once it is finished
    back = t.wait()                  # the result, or the transfer's error
    t.cancel()                       # stop it: nothing half-installed

The I/O (reads, writes, hashing) runs on a thread of its own; every change of block
ownership happens on the caller's thread: ``start`` before the thread begins (blocks
reserved or pinned), ``finish`` when ``poll``/``wait``/``cancel`` first sees the thread
ended, with what the work returned or raised (``None`` and ``cancelled`` after a cancel
that stopped it). Until then the blocks belong to the transfer: a reload's destination
blocks are RESERVED (nobody may read, share or free them) and an offload's source blocks
are pinned (read-only). The allocator is never touched from two threads.

``cancel`` asks the work to stop (it checks between blocks and between files), waits for
the thread, and runs ``finish`` as cancelled: the reload's blocks are given back, the
offload's temp files are removed and nothing is published. A transfer whose work already
finished is not cancelled (``cancel`` returns False): its result stands.

``Stepper`` (a test hook, never for serving): the work runs on its thread but waits at
each of its stop checks (before each block read, before each file written, before a
store's renames) until ``step()`` lets it through one, so the graph tour runs the I/O
thread as the spec schedules it (``refimpl/testing/on_api/worlds/host_cache.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from refimpl.tiers.files import Stopped

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["Cancelled", "Stepper", "Transfer"]

WAIT_S = 30.0  # a stepped thread that neither parks nor ends in this long is stuck


class Cancelled(Exception):
    """The transfer was cancelled before its work finished; nothing was installed."""


class Stepper:
    """A ``Transfer``'s I/O thread held at each stop check until ``step()`` (a test hook)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._parked = self._ended = self._open = False
        self._permits = 0
        self.passed = 0  # stop checks the thread went through

    def gate(self) -> None:
        """On the I/O thread, at a stop check: wait to be let through."""
        with self._cv:
            self._parked = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._permits > 0 or self._open)
            self._permits = max(0, self._permits - 1)
            self._parked = False
            self.passed += 1

    def end(self) -> None:
        with self._cv:
            self._ended = True
            self._cv.notify_all()

    def release(self) -> None:
        """Let the thread run on freely (a cancel)."""
        with self._cv:
            self._open = True
            self._cv.notify_all()

    def settle(self) -> bool:
        """Wait until the thread waits at a stop check (True) or its work ended (False)."""
        with self._cv:
            ok = self._cv.wait_for(
                lambda: (self._parked and not self._permits) or self._ended, WAIT_S
            )
            if not ok:
                raise RuntimeError("a stepped transfer neither parked nor ended")
            return not self._ended

    def step(self) -> bool:
        """Let the waiting thread through one stop check and wait until it waits at the
        next or ends; False (nothing done) when it was not waiting."""
        if not self.settle():
            return False
        with self._cv:
            self._permits += 1
            self._cv.notify_all()
        self.settle()
        return True

    @property
    def parked(self) -> bool:
        with self._cv:
            return self._parked and not self._ended


class Transfer(Generic[T, R]):
    """One tier copy in flight: ``work(stop)`` on a thread, ``finish`` on the caller's."""

    def __init__(
        self,
        name: str,
        work: Callable[[Callable[[], bool]], T],
        finish: Callable[[T | None, BaseException | None, bool], R],
        *,
        background: bool = True,
        stepper: Stepper | None = None,
    ) -> None:
        if stepper is not None and not background:
            raise ValueError("a stepped transfer runs on its own thread (background=True)")
        self.name = name
        self._stepper = stepper
        self._work, self._finish = work, finish
        self._stop = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._result: R | None = None
        self._final_error: BaseException | None = None
        self._finished = False
        self._cancelled = False
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name=f"kvown-tier-{name}")
            self._thread.daemon = True
            self._thread.start()
        else:
            self._run()

    def _stopped(self) -> bool:
        if self._stepper is not None:
            self._stepper.gate()
        return self._stop.is_set()

    def _run(self) -> None:
        try:
            self._value = self._work(self._stop.is_set if self._stepper is None else self._stopped)
        except BaseException as e:  # handed to the caller's thread by finish
            self._error = e
        finally:
            if self._stepper is not None:
                self._stepper.end()

    def _ended(self, timeout: float | None = 0.0) -> bool:
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        return not t.is_alive()

    def _settle(self) -> None:
        if self._finished:
            return
        self._finished = True
        cancelled = self._cancelled and isinstance(self._error, Stopped)
        self._cancelled = cancelled
        try:
            self._result = self._finish(self._value, self._error, cancelled)
        except BaseException as e:
            self._final_error = e

    def done(self) -> bool:
        """The work has ended (``poll`` settles it)."""
        return self._finished or self._ended()

    def poll(self) -> bool:
        """True once the transfer is finished and settled (non-blocking)."""
        if not self._finished and self._ended():
            self._settle()
        return self._finished

    def wait(self, timeout: float | None = None) -> R:
        """Block until finished; the result, or the transfer's error (``Cancelled``
        after a cancel that stopped it). TimeoutError: still running."""
        if not self._finished:
            if not self._ended(timeout):
                raise TimeoutError(f"transfer {self.name!r} still running after {timeout} s")
            self._settle()
        if self._cancelled:
            raise Cancelled(f"transfer {self.name!r} was cancelled")
        if self._final_error is not None:
            raise self._final_error
        return self._result  # type: ignore[return-value]

    def cancel(self) -> bool:
        """Stop the work and give back what it held; False when it had already finished
        (the result stands)."""
        if self._finished:
            return False
        self._cancelled = True
        self._stop.set()
        if self._stepper is not None:
            self._stepper.release()
        self._ended(None)
        self._settle()
        return self._cancelled

    @property
    def cancelled(self) -> bool:
        return self._finished and self._cancelled
