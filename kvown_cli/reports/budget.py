"""A hard deadline for work that checks none itself (issue #35: every budget a hard bound):
an exploration, a tour's plan, the API tour. ``fuzz --tour --seconds 10`` planned
``handoff_tp2to1`` for minutes (the explorer and the planner know no deadline) and
``fuzz --tour --impl api --seconds S`` ignored S. Within ``hard_deadline(d)`` the main
thread gets ``BudgetSpent`` once ``d`` passes (a real-time timer, SIGALRM), wherever it
is; the caller catches it, drops the cut work and reports what was done."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from refimpl.testing.run import BudgetSpent, Deadline


@contextlib.contextmanager
def hard_deadline(deadline: Deadline) -> Iterator[None]:
    """Raise ``BudgetSpent`` in the block once ``deadline`` passes (at once when it has);
    no bound when it is None, off the main thread, or while another timer is armed."""
    left = deadline.left()
    main = threading.current_thread() is threading.main_thread()
    if left is None or not main or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield  # no bound, no signals here, or the timer is someone else's (left alone)
        return
    if left <= 0:
        raise BudgetSpent
    armed = [True]

    def ring(signum: int, frame: FrameType | None) -> None:
        if armed:
            raise BudgetSpent

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    finally:
        armed.clear()  # a ring from here on is ignored
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
