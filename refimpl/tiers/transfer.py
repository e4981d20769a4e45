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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from refimpl.tiers.files import Stopped

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["Cancelled", "Transfer"]


class Cancelled(Exception):
    """The transfer was cancelled before its work finished; nothing was installed."""


class Transfer(Generic[T, R]):
    """One tier copy in flight: ``work(stop)`` on a thread, ``finish`` on the caller's."""

    def __init__(
        self,
        name: str,
        work: Callable[[Callable[[], bool]], T],
        finish: Callable[[T | None, BaseException | None, bool], R],
        *,
        background: bool = True,
    ) -> None:
        self.name = name
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

    def _run(self) -> None:
        try:
            self._value = self._work(self._stop.is_set)
        except BaseException as e:  # handed to the caller's thread by finish
            self._error = e

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
        self._ended(None)
        self._settle()
        return self._cancelled

    @property
    def cancelled(self) -> bool:
        return self._finished and self._cancelled
