"""The online monitor, and ``check-trace``'s entry points built on it.

An engine feeds ``Monitor`` one event at a time (a parsed JSON object, or a raw line)
and calls ``close`` when the run ends; ``check_file``/``check_text``/``check_log`` feed
a log through the same class, so the monitor and ``kvown check-trace`` give the same
verdicts by construction (and ``tests/model_checks/test_monitor.py`` checks it on every
log in the repository). Memory is one line plus the checker's bounded frontier.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import tempfile
from pathlib import Path
from typing import Any

from model_checks.conformance.checker import Checker
from model_checks.conformance.events import EventLog, LineParser
from model_checks.conformance.jsonline import HEAD, LineReader, LogError, text_lines
from model_checks.conformance.sizing import declares_world, prescan
from model_checks.conformance.verdict import Verdict


class Monitor:
    """Feed events in log order; ``feed``/``feed_line`` return the verdict once the run
    has violated the spec (and stay at it), else None. ``close`` checks the end of the run
    (``open_end=True``: the run goes on, so no end check) and returns the verdict.
    Malformed input raises ``LogError``. ``kw``: ``max_gap``, ``assumable``, ``mutants``.
    ``sizes``: the sizes of a declared world that the header lacks and that cannot grow
    (blocks, ranks, prefix; ``sizing.prescan``): online, the header should state them,
    else each is 1 (the prefix 0)."""

    def __init__(
        self,
        config: str | None = None,
        *,
        timeout_s: float | None = None,
        open_end: bool = False,
        sizes: dict[str, int] | None = None,
        **kw: Any,
    ) -> None:
        self.parser = LineParser(config, timeout_s, sizes)
        self._open = open_end
        self._kw = kw
        self.checker: Checker | None = None
        self.line = 0

    def _ck(self) -> Checker:
        ck = self.checker
        if ck is None:
            p = self.parser
            assert p.c is not None
            ck = self.checker = Checker(
                p.c,
                timeout_s=p.timeout,
                clock_skew_s=p.skew,
                clocks=p.owners,
                open_end=self._open,
                **self._kw,
            )
        return ck

    def feed(self, obj: dict[str, Any]) -> Verdict | None:
        """One event (or the header first) as a parsed JSON object."""
        self.line += 1
        ck = self.checker
        if ck is not None and ck.verdict is not None:
            return ck.verdict
        e = self.parser.feed_obj(self.line, obj)
        if e is None:
            return None
        if ck is None:
            ck = self._ck()
        return None if ck.step(e) else ck.verdict

    def feed_line(self, raw: bytes | str, n: int | None = None) -> Verdict | None:
        """One physical line of a log (``n``: its number; default the next)."""
        self.line = self.line + 1 if n is None else n
        if self.checker is not None and self.checker.verdict is not None:
            return self.checker.verdict
        e = self.parser.feed(self.line, raw)
        return None if e is None else self._step(e)

    def _step(self, e: Any) -> Verdict | None:
        ck = self._ck()
        return None if ck.step(e) else ck.verdict

    def close(self) -> Verdict:
        if self.checker is None or self.checker.verdict is None:
            self.parser.finish()
        return self._ck().finish()


def check_log(log: EventLog, *, open_end: bool = False, **kw: Any) -> Verdict:
    """Check a parsed log; ``kw``: ``max_gap``, ``assumable``, ``mutants`` (see Checker)."""
    ck = Checker(
        log.config,
        timeout_s=log.timeout_s,
        clock_skew_s=log.clock_skew_s,
        clocks=log.clocks,
        open_end=open_end,
        **kw,
    )
    for e in log.events:
        if not ck.step(e):
            break
    return ck.finish()


def _ahead(config: str | None, lines: Any, again: Any) -> dict[str, int] | None:
    """A declared world's sizes read ahead (``sizing.prescan``); since they come from the
    whole log, the whole log must be well formed: a malformed line anywhere is reported
    (LogError) before any verdict. None for a log that names its config."""
    if config is not None:
        return None
    sizes = prescan(lines)
    if sizes:
        p = LineParser(None, sizes=sizes)
        for n, raw in again():
            p.feed(n, raw)
        p.finish()
    return sizes


def check_text(data: bytes | str, config: str | None = None, **kw: Any) -> Verdict:
    """Check an in-memory log line by line; LogError on malformed input."""
    sizes = _ahead(config, text_lines(data), lambda: text_lines(data))
    m = Monitor(config, sizes=sizes, **kw)
    for n, raw in text_lines(data):
        if m.feed_line(raw, n) is not None:
            break
    return m.close()


def check_file(path: str | Path, config: str | None = None, **kw: Any) -> Verdict:
    """Check a log file, a pipe or a FIFO, line by line in bounded memory (two chunks and
    the checker's frontier). A log that names its config is read once and reading stops at
    the first violation. A log that declares its world (``sizing``) is read twice: once
    for its sizes (``sizing.prescan``), then checked, every line parsed to the end so that
    a malformed line anywhere is reported before any verdict; a pipe or FIFO is spooled
    to a temporary file as it is read the first time (issue #34: a declared world's log
    was kept in memory whole, 3.7 bytes per byte). LogError on malformed input or an
    unreadable file (with ``head``, the input itself when it was small: a caller's hint
    reads that)."""
    try:
        with open(path, "rb", buffering=0) as f:  # no read-ahead: what is read is counted
            lines = LineReader(f, keep=HEAD)
            if not lines.regular:  # what the first line's read takes, in case it is kept
                lines.copy = io.BytesIO()
            try:
                it = iter(lines)
                first = next(it, None)
                head = [] if first is None else [first]
                if config is None and first is not None and declares_world(first[1]):
                    return _check_declared(f, lines, itertools.chain(head, it), kw)
                lines.copy = None
                m = Monitor(config, **kw)
                for n, raw in itertools.chain(head, it):
                    if m.feed_line(raw, n) is not None:
                        break
            except LogError as exc:
                exc.head = lines.whole()  # what was read already: never a second read
                raise
    except OSError as exc:
        raise LogError(None, f"cannot read {path}: {exc.strerror or exc}") from None
    return m.close()


def _check_declared(f: Any, lines: LineReader, first: Any, kw: dict[str, Any]) -> Verdict:
    """The two reads of a declared world's log: its sizes, then the check (``check_file``);
    ``first``: ``lines``' lines, from the first (already read from ``f``)."""
    with contextlib.ExitStack() as stack:
        if lines.regular:
            sizes = prescan(first)
            f.seek(0)
            again: Any = f
        else:  # a pipe or FIFO: what is read goes to disk too, to be read again from there
            again = stack.enter_context(tempfile.TemporaryFile())
            assert isinstance(lines.copy, io.BytesIO)
            again.write(lines.copy.getvalue())  # what was read for the first line
            lines.copy = again
            sizes = prescan(first)
            again.seek(0)
        m = Monitor(None, sizes=sizes, **kw)
        body = iter(LineReader(again))
        for n, raw in body:
            if m.feed_line(raw, n) is not None:
                for n2, raw2 in body:  # the rest is parsed still: malformed is malformed
                    m.parser.feed(n2, raw2)
                break
        return m.close()
