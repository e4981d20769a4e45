"""Strict, bounded JSON for one log line: the only way a log line becomes a Python value.

A line is refused (``LogError`` naming it) when it is longer than ``MAX_LINE`` bytes,
is not UTF-8, nests arrays or objects deeper than ``MAX_DEPTH``, repeats a key in one
object, holds ``NaN``/``Infinity`` or a number that overflows a float, or an integer
literal longer than ``MAX_INT_DIGITS``. Every message shows values through ``show``:
a short, printable prefix. No exception other than ``LogError`` leaves ``loads_line``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import IO, Any

MAX_LINE = 1 << 16  # bytes per line, newline included
MAX_DEPTH = 8  # the format needs 2 (event -> args/observed); ignored fields get some room
MAX_INT_DIGITS = 20  # integer literals longer than this are refused before conversion
_SHOW = 40  # characters of a value an error message repeats
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


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


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Bad(f"duplicate key {show(k)}")
        out[k] = v
    return out


class _Bad(Exception):
    """A strictness refusal raised inside the json hooks."""


def _int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise _Bad(f"integer literal of {len(s)} characters (at most {MAX_INT_DIGITS} digits)")
    return int(s)


def _float(s: str) -> float:
    if len(s) > 4 * MAX_INT_DIGITS:
        raise _Bad(f"number literal of {len(s)} characters")
    f = float(s)
    if f in (float("inf"), float("-inf")):
        raise _Bad(f"number {show(s)} overflows a float")
    return f


def _constant(s: str) -> float:
    raise _Bad(f"{s} is not a number this format accepts")


def _depth(text: str) -> int:
    """Deepest nesting of arrays and objects, strings skipped (only run on lines that
    hold more than MAX_DEPTH brackets)."""
    depth = deepest = 0
    for ch in _STRINGS.sub("", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads_line(n: int, raw: bytes | str) -> Any:
    """Parse one line strictly; ``LogError(n, ...)`` for anything malformed."""
    if len(raw) > MAX_LINE:
        raise LogError(n, f"line longer than {MAX_LINE} bytes")
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LogError(n, f"not UTF-8 ({exc.reason})") from None
    else:
        text = raw
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise LogError(n, f"JSON nested deeper than {MAX_DEPTH}")
    try:
        return json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_int=_int,
            parse_float=_float,
            parse_constant=_constant,
        )
    except json.JSONDecodeError as exc:
        raise LogError(n, f"bad JSON: {exc.msg} (column {exc.colno})") from None
    except _Bad as exc:
        raise LogError(n, str(exc)) from None
    except (RecursionError, ValueError, OverflowError, TypeError, MemoryError) as exc:
        raise LogError(n, f"bad JSON ({type(exc).__name__})") from None


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
