"""Strict, bounded JSON for one log line: the only way a log line becomes a Python value.

A line is refused (``LogError`` naming it) when it is longer than ``MAX_LINE`` bytes,
is not UTF-8, nests arrays or objects deeper than ``MAX_DEPTH``, repeats a key in one
object, holds ``NaN``/``Infinity`` or a number that overflows a float, or an integer
literal longer than ``MAX_INT_DIGITS``. Every message shows values through ``show``:
a short, printable prefix. No exception other than ``LogError`` leaves ``loads_line``.
"""

from __future__ import annotations

import os
import select
import stat
import time
from collections.abc import Iterator
from typing import IO, Any

from spec.strict_json import StrictJSONError, loads_strict

MAX_LINE = 1 << 16  # bytes per line, newline included
MAX_DEPTH = 8  # the format needs 2 (event -> args/observed); ignored fields get some room
MAX_INT_DIGITS = 20  # integer literals longer than this are refused before conversion
_SHOW = 40  # characters of a value an error message repeats


class LogError(ValueError):
    """Malformed input; ``line`` is 1-based (None: not tied to a line). ``head``: the
    whole input, when it was small and had all been read (``LineReader.whole``), for a
    hint about what it is instead; None otherwise."""

    head: bytes | None = None

    def __init__(self, line: int | None, msg: str) -> None:
        self.line, self.msg = line, msg
        super().__init__(f"line {line}: {msg}" if line is not None else msg)


def show(v: object) -> str:
    """``repr(v)`` cut to a short printable prefix (an error message never echoes a
    10 MB value)."""
    try:
        try:
            s = repr(v) if len(v) <= 4 * _SHOW else repr(v[: 4 * _SHOW])  # type: ignore[arg-type,index]
        except TypeError:  # no len(): an int, say, which repr refuses past 4,300 digits
            s = repr(v)
    except (ValueError, RecursionError):
        s = f"<{type(v).__name__}>"
    s = "".join(ch if ch.isprintable() and ch.isascii() else "?" for ch in s)
    return s if len(s) <= _SHOW else s[: _SHOW - 3] + "..."


def cut(msg: str, limit: int = 160) -> str:
    """A message from elsewhere (which may quote a value in full) cut to ``limit``
    printable characters."""
    s = "".join(ch if ch.isprintable() and ch.isascii() else "?" for ch in msg[: limit + 1])
    return s if len(s) <= limit else s[: limit - 3] + "..."


def loads_line(n: int, raw: bytes | str) -> Any:
    """Parse one line strictly (``spec.strict_json``, the project's one reader of untrusted
    JSON, under this format's limits); ``LogError(n, ...)`` for anything malformed."""
    if len(raw) > MAX_LINE:
        raise LogError(n, f"line longer than {MAX_LINE} bytes")
    try:
        return loads_strict(
            raw,
            max_bytes=MAX_LINE,
            max_depth=MAX_DEPTH,
            max_int_digits=MAX_INT_DIGITS,
            max_float_chars=4 * MAX_INT_DIGITS,
            what="line",
        )
    except StrictJSONError as exc:
        raise LogError(n, str(exc)) from None


CHUNK = 1 << 16  # bytes asked of the stream at a time
HEAD = 1 << 16  # bytes of a stream's beginning kept for a hint (``LogError.head``)
MAX_SPOOL = 4 << 30  # bytes of a pipe's declared-world log spooled to disk (LineReader.copy)
GRACE = 0.5  # seconds a pipe's writer is given to end, at most, for that hint


class LineReader:
    """Physical lines of a binary stream, numbered from 1, without their newline. Memory is
    two chunks whatever the stream: a line past MAX_LINE is refused without reading the
    rest of it. Reads never wait for more than the stream has (``read1``), so a pipe or a
    FIFO streams; the first ``keep`` bytes read are kept (``head``) for a caller that wants
    to say what the input was without reading it again. ``copy``: a file every chunk read
    is written to as well (a pipe's log spooled to be read again), at most ``MAX_SPOOL``
    bytes."""

    def __init__(self, f: IO[bytes], keep: int = 0, copy: IO[bytes] | None = None) -> None:
        self.f, self.keep, self.copy = f, keep, copy
        self.head = bytearray()
        self.total = 0
        self.eof = False
        try:
            st = os.fstat(f.fileno())
            self._size: int | None = st.st_size if stat.S_ISREG(st.st_mode) else None
        except (OSError, AttributeError, ValueError):  # an in-memory stream: no file
            self._size = None

    def _read(self, n: int) -> bytes:
        read = getattr(self.f, "read1", self.f.read)  # unbuffered: read is one os.read
        try:
            b: bytes = read(CHUNK)
        except MemoryError:
            raise LogError(n, "out of memory reading the line") from None
        if not b:
            self.eof = True
        elif len(self.head) < self.keep:
            self.head += b[: self.keep - len(self.head)]
        self.total += len(b)
        if self.copy is not None and b:
            if self.total > MAX_SPOOL:
                raise LogError(
                    n,
                    f"a log that declares its world, read from a pipe, is spooled to a"
                    f" temporary file to be read twice: more than {MAX_SPOOL} bytes"
                    " (check it from a file)",
                )
            self.copy.write(b)
        return b

    @property
    def regular(self) -> bool:
        """Whether the stream is a regular file (it can be read again from its start)."""
        return self._size is not None

    def whole(self) -> bytes | None:
        """The whole input when it is at most ``keep`` bytes: what was read, and from a
        pipe or FIFO what it holds now and what its writer adds before it ends, waited
        for at most ``GRACE`` seconds in all (a live writer's pipe is not waited on past
        that: a writer that wrote everything but had not closed yet was a missing hint,
        issue #34), else None."""
        if not self.eof and self._size is None:
            self._drain()
        done = self.eof or (self._size is not None and self.total >= self._size)
        return bytes(self.head) if done and self.total <= self.keep else None

    def _drain(self) -> None:
        """Read on without blocking, up to one byte past ``keep``, until the stream ends
        or has said nothing more for what is left of ``GRACE`` seconds."""
        try:
            fd = self.f.fileno()
            was = os.get_blocking(fd)
        except (OSError, AttributeError, ValueError):
            return
        end = time.monotonic() + GRACE
        try:
            os.set_blocking(fd, False)
            while self.total <= self.keep:
                try:
                    b = os.read(fd, self.keep + 1 - self.total)
                except BlockingIOError:  # the writer is there: wait for it, bounded
                    left = end - time.monotonic()
                    if left <= 0:
                        return
                    select.select([fd], [], [], left)
                    continue
                if not b:
                    self.eof = True
                    return
                self.head += b[: self.keep - len(self.head)]
                self.total += len(b)
        except OSError:  # the stream failed: what was read is all there is
            return
        finally:
            try:
                os.set_blocking(fd, was)
            except OSError:
                pass

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        buf, pos, scan, n = bytearray(), 0, 0, 0
        while True:
            nl = buf.find(b"\n", scan)
            if nl >= 0:
                n += 1
                if nl - pos > MAX_LINE:
                    raise LogError(n, f"line longer than {MAX_LINE} bytes")
                yield n, bytes(buf[pos:nl])
                pos = scan = nl + 1
                continue
            if len(buf) - pos > MAX_LINE:
                raise LogError(n + 1, f"line longer than {MAX_LINE} bytes")
            del buf[:pos]
            pos, scan = 0, len(buf)
            b = self._read(n + 1)
            if not b:
                if buf:
                    yield n + 1, bytes(buf)
                return
            buf += b


def read_lines(f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``LineReader(f)``'s lines: a stream's physical lines, numbered from 1."""
    return iter(LineReader(f))


def text_lines(data: bytes | str) -> Iterator[tuple[int, bytes | str]]:
    """Physical lines of an in-memory log, numbered from 1."""
    sep: Any = b"\n" if isinstance(data, bytes) else "\n"
    start, n = 0, 0
    while start <= len(data):
        n += 1
        end = data.find(sep, start)
        if end < 0:
            end = len(data)
        yield n, data[start:end]
        start = end + 1
