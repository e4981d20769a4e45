"""Strict, bounded event-log parsing: every hostile line is a LogError naming its line,
with a short message, and nothing malformed is judged (issue #16, part 1)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from kvown_cli import check_trace as cmd_check_trace
from model_checks.conformance import LogError, Monitor, check_file, check_text
from model_checks.conformance.jsonline import CHUNK, MAX_LINE, read_lines

H = '{"config": "handoff_two", "version": 1}\n'
ADMIT = '{"action": "PrefillAdmit", "args": {"req": 0}'

# name: (log text, the line the error names, a fragment of the message)
HOSTILE: dict[str, tuple[str, int, str]] = {
    "deep nesting in an ignored field": (
        H + ADMIT + ', "note": ' + "[" * 1000 + "]" * 1000 + "}",
        2,
        "nested deeper",
    ),
    "integer literal of 5000 digits": (
        H + '{"action": "PrefillAdmit", "args": {"req": ' + "9" * 5000 + "}}",
        2,
        "integer literal",
    ),
    "timeout_s beyond the float range": (
        '{"config": "handoff_two", "timeout_s": ' + "9" * 400 + "}\n" + ADMIT + ', "t": 1}',
        1,
        "integer literal",
    ),
    "t overflows a float": (H + ADMIT + ', "t": 1e999}', 2, "overflows"),
    "t is NaN": (H + ADMIT + ', "t": NaN}', 2, "NaN"),
    "t is Infinity": (H + ADMIT + ', "t": -Infinity}', 2, "Infinity"),
    "t is a bool": (H + ADMIT + ', "t": true}', 2, "'t'"),
    "t out of range": (H + ADMIT + ', "t": 1e300}', 2, "'t'"),
    "msg is an array": (
        H + '{"action": "DecodeReserve", "args": {"req": 0, "msg": ["Handoff"], "epoch": 1}}',
        2,
        "'msg' must be a string",
    ),
    "msg is an object": (
        H + '{"action": "DecodeReserve", "args": {"req": 0, "msg": {}, "epoch": 1}}',
        2,
        "'msg' must be a string",
    ),
    "worker is an array": (
        H + '{"action": "EnvCrash", "args": {"worker": ["decode"]}}',
        2,
        "'worker' must be a string",
    ),
    "version true": (
        '{"config": "handoff_two", "version": true}\n' + ADMIT + "}",
        1,
        "unsupported version",
    ),
    "duplicate action key": (
        H + '{"action": "Bogus", "action": "PrefillAdmit", "args": {"req": 0}}',
        2,
        "duplicate key",
    ),
    "duplicate key in args": (
        H + '{"action": "PrefillAdmit", "args": {"req": 1, "req": 0}}',
        2,
        "duplicate key",
    ),
    "req is a bool": (H + '{"action": "PrefillAdmit", "args": {"req": true}}', 2, "'req'"),
    "observed value is an array": (H + ADMIT + ', "observed": {"st": ["x"]}}', 2, "observed"),
    "clock goes backwards": (
        H + ADMIT + ', "t": 5}\n{"action": "PrefillRun", "args": {"req": 0}, "t": 4}',
        3,
        "prefill clock goes backwards",
    ),
    "Now without t": (H + '{"action": "Now", "args": {"worker": "decode"}}', 2, "needs 't'"),
    "Now of no worker": (H + '{"action": "Now", "args": {"worker": "x"}, "t": 1}', 2, "worker"),
    "NUL bytes": ("\0" * 100, 1, "bad JSON"),
    "a line that is an array": (H + "[1, 2]", 2, "JSON object"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_line_is_a_clean_log_error(name: str) -> None:
    text, line, frag = HOSTILE[name]
    with pytest.raises(LogError) as ei:
        check_text(text.encode())
    assert ei.value.line == line, str(ei.value)
    assert frag in ei.value.msg
    assert len(ei.value.msg) <= 200 and "\n" not in ei.value.msg


def test_not_utf8() -> None:
    with pytest.raises(LogError, match="not UTF-8") as ei:
        check_text(H.encode() + b'{"action": "\xff"}')
    assert ei.value.line == 2


def test_a_huge_value_is_cut_in_the_message() -> None:
    name = "A" * 60_000
    with pytest.raises(LogError) as ei:
        check_text(H + json.dumps({"action": name, "args": {"req": 0}}))
    assert ei.value.line == 2 and len(ei.value.msg) < 100


def test_the_line_cap_refuses_without_reading_the_rest() -> None:
    f = io.BytesIO(b"x" * (3 * MAX_LINE))  # no newline at all, like /dev/zero
    with pytest.raises(LogError, match="longer than") as ei:
        list(read_lines(f))
    assert ei.value.line == 1 and f.tell() <= MAX_LINE + CHUNK < 3 * MAX_LINE


def test_clocks_are_per_worker() -> None:
    """Decode's clock may run behind prefill's by the stated skew: each clock must not go
    backwards, and two clocks may not be further apart than ``clock_skew_s``."""
    text = (
        '{"config": "handoff_two", "timeout_s": 30, "clock_skew_s": 100}\n'
        + ADMIT
        + ', "t": 100}\n'
        + '{"action": "PrefillRun", "args": {"req": 0}, "t": 101}\n'
        + '{"action": "PrefillFreeze", "args": {"req": 0}, "t": 102}\n'
        + '{"action": "DecodeReserve", "args": {"req": 0, "msg": "Handoff", "epoch": 1,'
        + ' "idx": 0}, "t": 3}\n'
    )
    assert check_text(text, open_end=True).conforms
    with pytest.raises(LogError, match="further apart than clock_skew_s=0.1") as ei:
        check_text(text.replace('"clock_skew_s": 100', '"clock_skew_s": 0.1'), open_end=True)
    assert ei.value.line == 5
    # a log that states no skew promises nothing across clocks: it is read, and the two
    # clocks, seen 99 s apart, are not compared (decode's reading judges no prefill wait)
    assert check_text(text.replace(', "clock_skew_s": 100', ""), open_end=True).conforms


def test_cli_malformed_is_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(H + ADMIT + ', "x": ' + "[" * 5000 + "]" * 5000 + "}\n")
    ap = argparse.ArgumentParser()
    cmd_check_trace.add_arguments(ap)
    rc = cmd_check_trace.run(ap.parse_args([str(p)]))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{p}:2:" in err
    with pytest.raises(LogError):
        check_file(p)


def test_monitor_refuses_a_malformed_object() -> None:
    m = Monitor("handoff_two")
    with pytest.raises(LogError, match="'req'"):
        m.feed({"action": "PrefillAdmit", "args": {"req": True}})


def test_a_named_process_has_its_own_clock() -> None:
    """Two prefill ranks are two processes: their clocks are compared apart."""
    H = '{"config": "handoff_two", "clocks": {"p0": "prefill", "p1": "prefill"}}\n'
    p0 = '{"action": "PrefillAdmit", "args": {"req": 0}, "t": 15.1, "proc": "p0"}'
    p1 = '{"action": "PrefillRun", "args": {"req": 0}, "t": 15.0, "clock": "p1"}'
    assert check_text(H + p0 + "\n" + p1, open_end=True).conforms
    with pytest.raises(LogError, match="prefill/p0 clock goes backwards"):
        check_text(H + p0 + "\n" + p0.replace("15.1", "15.0").replace("Admit", "Run"))
