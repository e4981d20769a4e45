"""The online Monitor gives check-trace's verdict on every log in the repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_checks.conformance import LogError, Monitor, check_file, check_log

ROOT = Path(__file__).resolve().parents[2]
LOGS = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("repro/**/*.jsonl"))


def test_there_are_logs() -> None:
    assert len(LOGS) >= 30


@pytest.mark.parametrize("name", LOGS)
def test_monitor_agrees_with_check_trace(name: str) -> None:
    path = ROOT / name
    want = check_file(path)
    m = Monitor()
    first: int | None = None
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            m.line = n  # blank lines keep their number, as in the file
            continue
        v = m.feed(json.loads(line))
        if v is not None and first is None:
            first = n
    got = m.close()
    assert got.to_json() == want.to_json()
    if not want.conforms:
        # the monitor raised it online: at the line itself, at the later line that
        # refuted the explanation, or at the end of the log (the stall checks)
        assert want.line is not None
        assert first in (want.line, want.refuted_by) or (
            first is None and want.violated in ("NoDeadlock",)
        )


def test_monitor_stays_at_its_verdict() -> None:
    m = Monitor("handoff_two")
    assert m.feed({"action": "PrefillAdmit", "args": {"req": 0}}) is None
    v = m.feed({"action": "DecodeStep", "args": {"req": 0}})
    assert v is not None and v.line == 2
    assert m.feed({"action": "PrefillRun", "args": {"req": 0}}) is v
    assert m.close() is v


def test_monitor_open_end_skips_the_stall_check() -> None:
    path = ROOT / "repro/traces/bug_stall_untimed.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for open_end, conforms in ((True, True), (False, False)):
        m = Monitor(open_end=open_end)
        for obj in lines:
            assert m.feed(obj) is None
        assert m.close().conforms is conforms
    assert check_file(path, open_end=True).conforms


def test_monitor_needs_an_event() -> None:
    m = Monitor()
    m.feed({"config": "handoff_two"})
    with pytest.raises(LogError, match="empty log"):
        m.close()


def test_raw_lines_numbered_by_the_monitor_give_check_traces_verdict() -> None:
    """feed_line without line numbers counts them itself, blank lines too; after the
    verdict, later lines are not read and the verdict stays."""
    for name in LOGS:
        path = ROOT / name
        want = check_file(path).to_json()
        m = Monitor()
        got = None
        for raw in path.read_bytes().split(b"\n"):
            v = m.feed_line(raw)
            assert got is None or v is got, name  # once given, the verdict stays
            got = got or v
        assert m.close().to_json() == want, name
        if got is not None:
            assert m.feed_line(b"not even JSON") is got


@pytest.mark.parametrize("name", LOGS)
def test_check_log_of_a_parsed_log_agrees(name: str) -> None:
    from model_checks.conformance.events import parse_log

    path = ROOT / name
    assert check_log(parse_log(path.read_bytes())).to_json() == check_file(path).to_json()
