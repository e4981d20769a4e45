"""The event-log parser's limits, each pinned at its boundary: the largest input a limit
allows is read, one past it is refused with a ``LogError`` naming the line. Values
quoted in messages are cut to a short printable prefix."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from model_checks.conformance.jsonline import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_LINE,
    LogError,
    cut,
    loads_line,
    read_lines,
    show,
    text_lines,
)
from spec import strict_json


def _nested(depth: int) -> str:
    """An object whose deepest bracket is ``depth`` levels down, after a closed sibling
    (so a counter that closes wrongly undercounts it)."""
    return '{"a": [[]], "b": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def test_a_line_of_max_line_bytes_is_read_and_one_more_is_refused() -> None:
    pad = MAX_LINE - len('{"note": ""}')
    fits = ('{"note": "' + "x" * pad + '"}').encode()
    assert len(fits) == MAX_LINE
    assert loads_line(1, fits) == {"note": "x" * pad}
    with pytest.raises(LogError, match=f"longer than {MAX_LINE}") as ei:
        loads_line(7, fits[:-2] + b'x"}')
    assert ei.value.line == 7
    # the same through the stream: the newline is not counted against the line
    assert [len(b) for _, b in read_lines(io.BytesIO(fits + b"\n" + fits))] == [MAX_LINE] * 2
    with pytest.raises(LogError, match="longer than") as ei:
        list(read_lines(io.BytesIO(fits + b"\n" + fits + b"x\n")))
    assert ei.value.line == 2


def test_nesting_of_max_depth_is_read_and_one_deeper_is_refused() -> None:
    assert isinstance(loads_line(1, _nested(MAX_DEPTH)), dict)
    with pytest.raises(LogError, match=f"nested deeper than {MAX_DEPTH}"):
        loads_line(1, _nested(MAX_DEPTH + 1))
    # brackets inside strings are not nesting
    assert loads_line(1, '{"note": "' + "[" * 50 + '"}') == {"note": "[" * 50}


@pytest.mark.parametrize("sign", ["", "-"])
def test_integers_of_max_digits_are_read_and_one_more_digit_is_refused(sign: str) -> None:
    n = sign + "9" * MAX_INT_DIGITS
    assert loads_line(1, '{"t": ' + n + "}") == {"t": int(n)}
    with pytest.raises(LogError, match="integer literal"):
        loads_line(1, '{"t": ' + n + "9}")


def test_number_literals_of_80_characters_are_read_and_longer_ones_are_refused() -> None:
    limit = 4 * MAX_INT_DIGITS
    fits = "0." + "0" * (limit - 3) + "5"
    assert len(fits) == limit and loads_line(1, f"[{fits}]") == [float(fits)]
    with pytest.raises(LogError, match=f"number literal of {limit + 1} characters"):
        loads_line(1, f"[{fits}5]")
    with pytest.raises(LogError, match="overflows a float"):
        loads_line(1, "[1e999]")


def test_show_quotes_a_short_printable_prefix() -> None:
    assert show("abc") == "'abc'"
    assert show("a\x00b\u00e9") == "'a\\x00b?'"  # repr escapes NUL; non-ASCII becomes ?
    fits = "x" * 38  # repr adds two quotes: exactly 40 characters, kept whole
    assert show(fits) == repr(fits)
    long = show("y" * 10_000)
    assert len(long) == 40 and long.endswith("...") and long.startswith("'yyy")
    assert show(list(range(10_000))).endswith("...") and len(show(list(range(10_000)))) == 40
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert show(deep) == "<list>"  # repr would recurse past the limit
    assert show(10**5000) == "<int>"  # repr refuses over 4,300 digits
    assert show(12) == "12" and show(None) == "None"


def test_cut_keeps_short_messages_and_cuts_long_ones() -> None:
    assert cut("ok") == "ok"
    assert cut("z" * 160) == "z" * 160
    assert cut("z" * 161) == "z" * 157 + "..."
    assert cut("tab\there") == "tab?here"
    assert len(cut("w" * 10**6, limit=20)) == 20


def test_text_lines_numbers_physical_lines_blank_ones_too() -> None:
    assert list(text_lines("\n{}\n\nx")) == [(1, ""), (2, "{}"), (3, ""), (4, "x")]
    assert list(text_lines(b"\n{}\n")) == [(1, b""), (2, b"{}"), (3, b"")]
    assert list(text_lines("")) == [(1, "")]


def test_the_limits_are_the_documented_ones() -> None:
    doc = (Path(__file__).resolve().parents[2] / "spec" / "EVENTLOG.md").read_text()
    assert MAX_LINE == 64 * 1024 and "longer than 64 KiB" in doc
    assert MAX_DEPTH == 8 and "nested deeper than 8" in doc
    assert MAX_INT_DIGITS == 20 and "more than 20 digits" in doc


class _Boom:
    def __repr__(self) -> str:
        raise ValueError("not this one")


def test_show_reads_only_a_prefix_of_a_long_value() -> None:
    v = ["a"] * 200 + [_Boom()]  # its whole repr would raise; the head never reaches it
    assert show(v).startswith("['a', 'a'")
    assert show([_Boom()]) == "<list>"


def test_a_parser_failure_of_any_kind_is_a_log_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for exc in (RecursionError, MemoryError, OverflowError):

        def fail(*a: object, _e: type[BaseException] = exc, **k: object) -> None:
            raise _e()

        monkeypatch.setattr(strict_json.json, "loads", fail)
        with pytest.raises(LogError, match=exc.__name__) as ei:
            loads_line(3, b"{}")
        assert ei.value.line == 3


def test_running_out_of_memory_reading_a_line_is_a_log_error() -> None:
    class Starved(io.BytesIO):  # gives the first line, then fails
        def read1(self, size: int | None = -1) -> bytes:
            if self.tell():
                raise MemoryError
            return super().read1(3)

    with pytest.raises(LogError, match="out of memory") as ei:
        list(read_lines(Starved(b"{}\n{}\n")))
    assert ei.value.line == 2
