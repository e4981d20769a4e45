"""Progress and output width, the one way for every command.

:class:`Progress` shows how far a long command is: on a terminal a transient rich bar on
stderr; in a log (stderr not a terminal: CI) plain lines at a steady rate, one every
``KVOWN_PROGRESS_SECONDS`` (default 20 s, so at least one a minute, whatever the work
does), each ``kvown CMD: DONE/TOTAL UNIT, RATE/s, about T left (NOTE)``. No ``\\r``, no
colour, nothing for a command that ends before the first tick. The one in use answers
:func:`partial` (what was done so far) when Ctrl-C ends the command.

:func:`console` is the stdout console of the tables: on a terminal its width; piped, wide
enough that no name is cut (``WIDE`` columns).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console

WIDE = 240  # columns of a piped table: every id and name of the tables fits
DEFAULT_EVERY = 20.0  # seconds between two plain progress lines
_CURRENT: list[Progress] = []
_INTERRUPTED: list[str] = []  # the line of a progress that Ctrl-C ended (for main's summary)


def console(stderr: bool = False) -> Console:
    """A console with no emoji codes or highlighting; piped, ``WIDE`` columns."""
    con = Console(stderr=stderr, emoji=False, highlight=False)
    if not con.is_terminal:
        con.width = max(con.width, WIDE)
    return con


def interval() -> float:
    """Seconds between two plain lines: ``KVOWN_PROGRESS_SECONDS``, else 20."""
    text = os.environ.get("KVOWN_PROGRESS_SECONDS", "")
    try:
        v = float(text)
    except ValueError:
        return DEFAULT_EVERY
    return v if 0.01 <= v <= 3600 else DEFAULT_EVERY


def duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``3.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def partial(wait_s: float | None = None) -> str | None:
    """The running command's progress as one line (for the Ctrl-C summary), or None.
    ``wait_s``: from another thread (the forced exit), the longest wait for its lock."""
    if _CURRENT:
        p = _CURRENT[-1]
        if wait_s is not None:
            if not p._lock.acquire(timeout=wait_s):
                return None
            p._lock.release()
        return p.body(final=True)
    return _INTERRUPTED.pop() if _INTERRUPTED else None


class Progress:
    """``with Progress("check", total=9, unit="configs") as p: ... p.advance(note=...)``.

    ``total`` may be None (unknown). ``summary``, when given, adds a note of what was found
    so far to every line (e.g. killed/survived). ``enabled=False`` shows nothing."""

    def __init__(
        self,
        command: str,
        total: int | None,
        unit: str,
        *,
        enabled: bool = True,
        summary: Callable[[], str] | None = None,
    ) -> None:
        self.command, self.total, self.unit, self.summary = command, total, unit, summary
        self.done, self.note = 0, ""
        self.t0 = time.monotonic()
        self.t_work, self.done_at_work = self.t0, 0  # where the rate is measured from
        self.enabled = enabled
        self.lines = 0  # plain lines written
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: object | None = None
        self._task: object | None = None
        self._terminal = enabled and sys.stderr is not None and sys.stderr.isatty()

    # ---- the two views
    def __enter__(self) -> Progress:
        _INTERRUPTED.clear()
        _CURRENT.append(self)
        if not self.enabled:
            return self
        if self._terminal:
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} " + self.unit),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            bar.start()
            self._bar, self._task = bar, bar.add_task(self.command, total=self.total)
        else:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            _INTERRUPTED[:] = [self.body(final=True)]
        self.close(ended=kind is None)

    def close(self, ended: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
            if ended and self.lines:  # a log that had lines gets the last one too
                self._write(self.line(final=True))
        if self._bar is not None:
            self._bar.stop()  # type: ignore[attr-defined]
            self._bar = None
        if self in _CURRENT:
            _CURRENT.remove(self)

    # ---- the work reports here
    def update(self, done: int | None = None, note: str | None = None) -> None:
        with self._lock:
            if done is not None:
                self.done = done
            if note is not None:
                self.note = note
        if self._bar is not None:
            desc = f"{self.command} {self.note}".strip()
            self._bar.update(  # type: ignore[attr-defined]
                self._task, completed=self.done, total=self.total, description=desc
            )

    def start_work(self) -> None:
        """The rate (and the time left) is measured from now: what came before was a
        one-off start-up (a prefilter, a prefetch), not the work left."""
        with self._lock:
            self.t_work, self.done_at_work = time.monotonic(), self.done

    def advance(self, n: int = 1, note: str | None = None) -> None:
        with self._lock:
            self.done += n
        self.update(None, note)

    def skip(self, n: int = 1, note: str | None = None) -> None:
        """``n`` items done without the work (a script that does not apply here): counted
        in DONE, left out of the rate, so the time left is not read from them."""
        with self._lock:
            self.done += n
            self.done_at_work += n
        self.update(None, note)

    # ---- plain lines
    def line(self, final: bool = False) -> str:
        return f"kvown {self.command}: {self.body(final)}"

    def body(self, final: bool = False) -> str:
        """``DONE/TOTAL UNIT, ELAPSED, RATE, about T left (NOTE; SUMMARY)``."""
        with self._lock:
            done, note = self.done, self.note
            t_work, worked = self.t_work, self.done - self.done_at_work
        now = time.monotonic()
        took, working = now - self.t0, now - t_work
        of = f"/{self.total}" if self.total is not None else ""
        parts = [f"{done}{of} {self.unit}", f"{duration(took)}"]
        if worked > 0 and working > 0:  # measured on the work itself, since start_work
            rate = worked / working
            each = f"{working / worked:.3g} s each"
            parts.append(f"{rate:.3g} {self.unit}/s" if rate >= 0.1 else each)
            if self.total is not None and not final and done < self.total:
                parts.append(f"about {duration((self.total - done) / rate)} left")
        extra = [x for x in (note, self.summary() if self.summary else "") if x]
        tail = f" ({'; '.join(extra)})" if extra else ""
        return f"{', '.join(parts)}{tail}"

    def _tick(self) -> None:
        every = interval()
        while not self._stop.wait(every):
            self._write(self.line())

    def _write(self, text: str) -> None:
        self.lines += 1
        try:
            print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass
