"""Strict, bounded JSON for one log line: the only way a log line becomes a Python value.

A line is refused (``LogError`` naming it) when it is longer than ``MAX_LINE`` bytes,
is not UTF-8, nests arrays or objects deeper than ``MAX_DEPTH``, repeats a key in one
object, holds ``NaN``/``Infinity`` or a number that overflows a float, or an integer
literal longer than ``MAX_INT_DIGITS``. Every message shows values through ``show``:
a short, printable prefix. No exception other than ``LogError`` leaves ``loads_line``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from spec.strict_json import StrictJSONError, loads_strict

MAX_LINE = 1 << 16  # bytes per line, newline included
MAX_DEPTH = 8  # the format needs 2 (event -> args/observed); ignored fields get some room
MAX_INT_DIGITS = 20  # integer literals longer than this are refused before conversion
_SHOW = 40  # characters of a value an error message repeats


class LogError(ValueError):
    """Malformed input; ``line`` is 1-based (None: not tied to a line)."""

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


def read_lines(f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Physical lines of a binary stream, numbered from 1, without their newline; memory
    is one line: a line past MAX_LINE is refused without reading the rest of it."""
    n = 0
    while True:
        n += 1
        try:
            b = f.readline(MAX_LINE + 1)
        except MemoryError:
            raise LogError(n, "out of memory reading the line") from None
        if not b:
            return
        if b.endswith(b"\n"):
            b = b[:-1]
        elif len(b) > MAX_LINE:
            raise LogError(n, f"line longer than {MAX_LINE} bytes")
        yield n, b


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
