"""Generated hostile event logs (issue #16): every conforming log of ``repro/traces``
with one line made malformed in one of many ways. Each must be refused as a ``LogError``
naming exactly that line, with one short line of message: never a traceback, never a
verdict (a malformed log is not judged, so it is never judged conforming).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from model_checks.conformance import LogError, check_text

TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"
CONFORMING = sorted(
    p for p in TRACES.glob("*.jsonl") if p.name.startswith(("ok_", "fixed_", "fix_"))
)

Edit = Callable[[dict[str, object]], str | None]  # an event -> a malformed line (None: n/a)


def _dump(obj: object) -> str:
    return json.dumps(obj)


def _with(ev: dict[str, object], raw: str) -> str:
    """The event with one more raw member (raw JSON text, possibly not valid JSON)."""
    return _dump(ev)[:-1] + ", " + raw + "}"


def _args(ev: dict[str, object], key: str, value: object, add: bool = False) -> str | None:
    """The event with argument ``key`` set to ``value`` (``add``: a key it lacks)."""
    args = ev.get("args")
    if not isinstance(args, dict) or (key in args) == add:
        return None
    return _dump({**ev, "args": {**args, key: value}})


EVENT_EDITS: dict[str, Edit] = {
    "truncated JSON": lambda ev: _dump(ev)[:-1],
    "not an object: array": lambda ev: _dump([ev]),
    "not an object: string": lambda ev: _dump(_dump(ev)),
    "not an object: null": lambda ev: "null",
    "action is an integer": lambda ev: _dump({**ev, "action": 12345}),
    "action is null": lambda ev: _dump({**ev, "action": None}),
    "action unknown": lambda ev: _dump({**ev, "action": "PrefillTeleport"}),
    "action missing": lambda ev: _dump({k: v for k, v in ev.items() if k != "action"}),
    "duplicate action key": lambda ev: '{"action": "Bogus", ' + _dump(ev)[1:],
    "args is an array": lambda ev: _dump({**ev, "args": [0]}),
    "args is a string": lambda ev: _dump({**ev, "args": "req=0"}),
    "args has an unknown key": lambda ev: _args(ev, "rq", 0, add=True),
    "req is a bool": lambda ev: _args(ev, "req", True),
    "req is a string": lambda ev: _args(ev, "req", "0"),
    "req out of range": lambda ev: _args(ev, "req", 99999),  # past a declared world's 4096 too
    "req negative": lambda ev: _args(ev, "req", -1),
    "req is a float": lambda ev: _args(ev, "req", 0.5),
    "msg is an array": lambda ev: _args(ev, "msg", ["Chunk"]),
    "msg is an object": lambda ev: _args(ev, "msg", {"kind": "Chunk"}),
    "msg of no kind": lambda ev: _args(ev, "msg", "Telegram"),
    "worker unknown": lambda ev: _args(ev, "worker", "router"),
    "t is NaN": lambda ev: _with(ev, '"t": NaN'),
    "t is -Infinity": lambda ev: _with(ev, '"t": -Infinity'),
    "t overflows a float": lambda ev: _with(ev, '"t": 1e999'),
    "t is negative": lambda ev: _with(ev, '"t": -1'),
    "t is a bool": lambda ev: _with(ev, '"t": true'),
    "t is a string": lambda ev: _with(ev, '"t": "now"'),
    "integer of 40 digits in an ignored field": lambda ev: _with(ev, '"note": ' + "7" * 40),
    "nesting 64 deep in an ignored field": lambda ev: _with(ev, '"note": ' + "[" * 64 + "]" * 64),
    "observed status unknown": lambda ev: _with(ev, '"observed": {"req": 0, "st": "zombie"}'),
    "observed field unknown": lambda ev: _with(ev, '"observed": {"req": 0, "colour": "red"}'),
    "observed is an array": lambda ev: _with(ev, '"observed": [0]'),
}


def _events(path: Path) -> list[str]:
    return path.read_text().splitlines()


def cases() -> Iterator[tuple[str, str, int, str]]:
    """(id, log text, the line the error must name, edit) for every applicable edit."""
    for path in CONFORMING:
        lines = _events(path)
        for k in range(1, len(lines)):
            ev = json.loads(lines[k])
            if not isinstance(ev, dict) or "action" not in ev:
                continue
            for name, edit in EVENT_EDITS.items():
                bad = edit(ev)
                if bad is None:
                    continue
                text = "\n".join([*lines[:k], bad, *lines[k + 1 :]]) + "\n"
                yield f"{path.stem}:{k + 1}:{name}", text, k + 1, name


CASES = list(cases())


def test_the_generator_covers_every_edit_at_least_500_times_over() -> None:
    assert len(CONFORMING) >= 5
    assert len(CASES) >= 500
    assert {c[3] for c in CASES} == set(EVENT_EDITS)  # every edit applies somewhere


@pytest.mark.parametrize("path", CONFORMING, ids=lambda p: p.stem)
def test_the_unedited_logs_conform(path: Path) -> None:
    """So that each refusal below comes from its one edited line."""
    assert check_text(path.read_bytes()).conforms


@pytest.mark.parametrize("edit", sorted(EVENT_EDITS))
def test_hostile_event_lines_are_clean_log_errors(edit: str) -> None:
    picked = [c for c in CASES if c[3] == edit]
    for cid, text, line, _ in picked:
        with pytest.raises(LogError) as ei:
            check_text(text.encode())
        err = ei.value
        assert err.line == line, f"{cid}: error names line {err.line}: {err.msg}"
        assert "\n" not in err.msg and len(err.msg) <= 300, cid


HEADER_EDITS: dict[str, str] = {
    "version is true": '{"config": "handoff_two", "version": true}',
    "version 2": '{"config": "handoff_two", "version": 2}',
    "version a string": '{"config": "handoff_two", "version": "1"}',
    "config unknown": '{"config": "handoff_seven", "version": 1}',
    "config an integer": '{"config": 7, "version": 1}',
    "timeout_s zero": '{"config": "handoff_two", "version": 1, "timeout_s": 0}',
    "timeout_s a string": '{"config": "handoff_two", "version": 1, "timeout_s": "3s"}',
    "timeout_s NaN": '{"config": "handoff_two", "version": 1, "timeout_s": NaN}',
    "duplicate config": '{"config": "handoff_two", "config": "prefix_share", "version": 1}',
}


@pytest.mark.parametrize("name", sorted(HEADER_EDITS))
def test_hostile_headers_are_clean_log_errors(name: str) -> None:
    text = HEADER_EDITS[name] + '\n{"action": "PrefillAdmit", "args": {"req": 0}}\n'
    with pytest.raises(LogError) as ei:
        check_text(text.encode())
    assert ei.value.line == 1, ei.value.msg
    assert "\n" not in ei.value.msg
