"""Worlds declared by a log's header and sized from the log (issue #32 item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from model_checks.conformance import LogError, Monitor, check_file, check_text
from model_checks.conformance.jsonline import text_lines
from model_checks.conformance.sizing import prescan

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "repro" / "traces"


def _hdr(**kw: object) -> str:
    return json.dumps({"format": "kvown-eventlog", "version": 1, **kw})


def _ev(action: str, req: int | None = None, **args: object) -> str:
    a: dict[str, object] = {} if req is None else {"req": req}
    return json.dumps({"action": action, "args": {**a, **args}})


def _handoff(r: int, blocks: int = 1, ep: int = 1) -> list[str]:
    def m(kind: str, idx: int = 0) -> dict[str, object]:
        return {"msg": kind, "epoch": ep, "idx": idx}

    return [
        _ev("PrefillAdmit", r),
        _ev("PrefillRun", r),
        _ev("PrefillFreeze", r),
        _ev("DecodeReserve", r, **m("Handoff")),
        _ev("PrefillRecvReady", r, **m("Ready")),
        *[_ev("PrefillSendChunk", r) for _ in range(blocks + 1)],
        *[_ev("DecodeReceiveChunk", r, **m("Chunk", k)) for k in range(blocks)],
        _ev("DecodeReceiveDone", r, **m("RankDone")),
        _ev("DecodeValidate", r),
        _ev("DecodeCommit", r),
        _ev("PrefillRelease", r, **m("Ack")),
        _ev("DecodeFinish", r),
    ]


def _log(header: str, lines: list[str]) -> str:
    return "\n".join([header, *lines]) + "\n"


def test_as_many_requests_as_the_log_shows() -> None:
    """Twelve requests in one world: no cap of four."""
    lines = [x for r in range(12) for x in _handoff(r)]
    v = check_text(_log(_hdr(behaviours=[]), lines))
    assert v.conforms and v.config == "log", v.reason


def test_blocks_are_read_from_the_log_and_a_stated_size_wins() -> None:
    lines = _handoff(0, blocks=3)
    assert prescan(text_lines(_log(_hdr(behaviours=[]), lines)))["blocks"] == 3
    assert check_text(_log(_hdr(behaviours=[]), lines)).conforms
    v = check_text(_log(_hdr(behaviours=[], sizes={"blocks": 4}), lines))
    # with 4 blocks the fourth send is block 3, not the RankDone decode then receives
    assert (v.conforms, v.line) == (False, 14), v.reason


def test_the_monitor_takes_the_sizes_it_is_given() -> None:
    text = _log(_hdr(behaviours=[]), _handoff(0, blocks=2))
    want = check_text(text)
    m = Monitor(sizes={"blocks": 2})
    for raw in text.splitlines():
        m.feed_line(raw)
    assert m.close().to_json() == want.to_json() and want.conforms


def test_a_logged_fault_widens_the_world() -> None:
    """A crash the header did not declare: its kind and one more fault come with it."""
    lines = [*_handoff(0)[:3], _ev("EnvCrash", worker="prefill"), _ev("PrefillRun", 1)]
    v = check_text(_log(_hdr(behaviours=[]), lines))
    assert (v.line, v.violated) == (6, "Fencing"), v.reason


def test_attempts_and_turns_grow() -> None:
    v = check_file(TRACES / "fixed_third_turn_after_evict.jsonl")
    assert v.conforms, v.reason  # two turns after the first, a second attempt
    lines = (TRACES / "fixed_third_turn_after_evict.jsonl").read_text().splitlines()
    old = check_text("\n".join([_hdr(config="turns_append"), *lines[1:]]))
    assert not old.conforms and old.line == 20  # the named world has one turn after the first


@pytest.mark.parametrize(
    ("header", "what"),
    [
        (_hdr(behaviours=["teleport"]), "unknown behaviours ['teleport']"),
        (_hdr(faults=["meteor"]), "unknown fault kinds ['meteor']"),
        (_hdr(sizes={"blocks": -1}), "'sizes' must map names to integers"),
        (_hdr(sizes={"colour": 1}), "unknown sizes ['colour']"),
        (_hdr(behaviours="turns"), "'behaviours' must be a list of names"),
    ],
)
def test_a_bad_declaration_is_bad_input(header: str, what: str, tmp_path: Path) -> None:
    text = _log(header, _handoff(0)[:2])
    with pytest.raises(LogError, match="line 1") as exc:
        check_text(text)
    assert what in str(exc.value)
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    cmd = [sys.executable, "-m", "kvown_cli.main", "check-trace", str(f)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and what in p.stdout + p.stderr


def test_a_declared_world_judges_as_its_named_twin() -> None:
    """handoff_decode_fail's logs under a header that declares the same world."""
    named = {"decode_failure": ["decode_failure"], "corrupt": ["corrupt"]}
    for name in ("bug_step_after_decode_failure.jsonl", "fixed_step_after_decode_failure.jsonl"):
        lines = (TRACES / name).read_text().splitlines()
        assert json.loads(lines[0])["config"] == "handoff_decode_fail"
        hdr = _hdr(
            behaviours=named["decode_failure"],
            faults=named["corrupt"],
            sizes={"blocks": 2, "cap_p": 2, "cap_d": 2, "attempts": 2},
        )
        a, b = check_text("\n".join(lines)), check_text("\n".join([hdr, *lines[1:]]))
        assert (a.conforms, a.violated, a.line) == (b.conforms, b.violated, b.line)


def test_growth_past_its_bounds_is_judged_not_a_crash() -> None:
    """Sixteen attempts of one request (the epoch bound is 15): a verdict, no traceback."""
    lines = [_ev("PrefillAdmit", 0), _ev("PrefillRun", 0)]
    lines += [_ev("DecodeReserve", 0, msg="Handoff", epoch=16, idx=0)]
    v = check_text(_log(_hdr(behaviours=[]), lines))
    assert not v.conforms and v.line == 4
    big = _log(_hdr(behaviours=[], sizes={"blocks": 8, "src_tp": 2}), lines[:1])
    with pytest.raises(LogError, match="too large"):
        check_text(big)


# ------------------------------------------------- read twice, never kept (issue #34)
def _padded(lines: list[str], mb: float) -> str:
    """A declared world's log padded with whitespace-only lines (each skipped)."""
    return _log(_hdr(behaviours=[]), lines) + (" " * 49 + "\n") * int(mb * (1 << 20) / 50)


def _file_peak(path: Path) -> int:
    tracemalloc.start()
    try:
        assert check_file(path).conforms
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_declared_world_file_is_not_kept_in_memory(tmp_path: Path) -> None:
    """Before: the whole log was kept as it was read (3.7 bytes per byte, 520 MB RSS for
    100 MB); now the file is read twice (its sizes, then the check): memory is two chunks
    and the checker's state, whatever the log's length."""
    path = tmp_path / "big.jsonl"
    path.write_text(_padded(_handoff(0, blocks=3), 4))
    assert _file_peak(path) < 2 << 20  # 4 MB of log


def _via_fifo(tmp_path: Path, text: str) -> Any:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(text.encode())

    w = threading.Thread(target=write, daemon=True)
    w.start()
    try:
        return check_file(fifo)
    finally:
        w.join()


def test_a_declared_world_from_a_fifo_is_spooled_and_sized_as_from_a_file(
    tmp_path: Path,
) -> None:
    """A pipe cannot be read twice: it goes to a temporary file as it is read, so its
    sizes (3 blocks here, read ahead) are those of the same log in a file."""
    text = _padded(_handoff(0, blocks=3), 0.3)
    path = tmp_path / "log.jsonl"
    path.write_text(text)
    want = check_file(path)
    assert want.conforms
    assert _via_fifo(tmp_path, text).to_json() == want.to_json()


@pytest.mark.parametrize("fifo", [False, True])
def test_a_malformed_line_after_a_violation_is_still_reported(tmp_path: Path, fifo: bool) -> None:
    """The check stops at the violation but parses on: malformed is malformed (exit 2)."""
    bad = [*_handoff(0)[:2], _ev("DecodeCommit", 0), *_handoff(1)[:2], "{not json"]
    text = _log(_hdr(behaviours=[]), bad)
    assert not check_text(text.replace("{not json", "")).conforms
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(LogError) as ei:
        _via_fifo(tmp_path, text) if fifo else check_file(path)
    assert ei.value.line == len(bad) + 1
