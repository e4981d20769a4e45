"""A time budget counts from the command's start, imports included (issue #35, What to
build 1): ``kvown fuzz --mutant release_keeps_wait --seconds 5`` took 16.9 s when the
budget started at the hunt, 12 s of it importing torch on a loaded machine. No timed
assert: each test makes the start-up longer than the budget and reads the command's own
accounting (``budget`` in its JSON): the start-up is counted, and the hunt stops at once
and says the budget ran out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvown_cli.main as kvown_main
from kvown_cli import usage

ROOT = Path(__file__).resolve().parents[2]
SLOW_START = 6.0  # seconds of start-up before kvown runs: past the 5 s budget


def test_the_executable_counts_its_start_up_in_the_budget() -> None:
    """A process that spends 6 s before kvown's entry (as slow imports do) has spent its
    5 s budget: the hunt takes at most one step and reports the time it started at."""
    code = (
        f"import time; time.sleep({SLOW_START}); import sys; sys.argv = ['kvown', 'fuzz',"
        " '--config', 'offload_contend', '--seconds', '5', '--json'];"
        " from kvown_cli.main import entry; entry()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    spent, (cfg,) = got["budget"], got["configs"]
    assert spent["seconds"] == 5 and spent["out_of_time"] is True
    assert spent["startup_s"] >= SLOW_START  # the sleep before main is counted
    assert spent["elapsed_s"] >= spent["startup_s"] >= 5
    assert cfg["steps"] <= 1 and not cfg["failed"], cfg  # stopped at its first step


def test_the_first_switch_of_a_kill_run_counts_the_start_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kvown_main, "_ENTRY_START", [time.monotonic() - SLOW_START])
    rc = kvown_main.main(["fuzz", "--mutant", "reject_unfenced", "--seconds", "5", "--json"])
    got = json.loads(capsys.readouterr().out)
    (k,) = got["mutants"]
    assert rc == 1 and (k["killed"], k["out_of_time"]) == (False, True), k
    assert got["budget"]["seconds"] == 5 and got["budget"]["startup_s"] >= SLOW_START


def test_a_command_called_in_process_starts_its_clock_at_the_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``main`` in a process that did other work first (a test run, here an hour of it) is
    not charged for it: only the executable's ``entry`` counts from the process start."""
    monkeypatch.setattr(usage, "process_started", lambda: time.monotonic() - 3600)
    rc = kvown_main.main(["fuzz", "--config", "handoff_tp2to1", "--seconds", "2", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and got["budget"]["out_of_time"] is True
    assert 2 <= got["budget"]["elapsed_s"] < 3600


# Work that checks no deadline itself (an exploration, a tour's plan, the API tour) is cut
# by the budget all the same (kvown_cli.reports.budget): ``fuzz --tour --seconds 10``
# planned handoff_tp2to1 for minutes, ``--impl api`` ignored ``--seconds``, and the state
# share after a hunt ran past the budget. Each stand-in below never ends by itself.
def _endless(*args: object, **kw: object) -> None:
    for _ in range(3000):  # 30 s, far past the 1 s budget: then the test fails
        time.sleep(0.01)
    raise AssertionError("the budget did not cut the work")


def test_the_budget_cuts_a_tour_plan(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import refimpl.testing.tour as tour

    monkeypatch.setattr(tour, "plan_tour", _endless)
    rc = kvown_main.main(["fuzz", "--tour", "--config", "mismatch_one", "--seconds", "1"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "budget ran out while planning mismatch_one, before any tour (0 of 1" in err, err


def test_the_budget_cuts_the_api_tour(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import refimpl.testing.on_api.report as report

    monkeypatch.setattr(report, "plan_for", _endless)
    argv = ["fuzz", "--tour", "--impl", "api", "--seconds", "1", "--json"]
    assert kvown_main.main(argv) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["out_of_time_in"] == "mismatch_one" and got["complete"] is False


def test_the_budget_cuts_the_state_share_after_a_hunt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvown_cli.fuzz as fuzz

    monkeypatch.setattr(fuzz, "state_share", _endless)
    argv = ["fuzz", "--config", "offload_contend", "--examples", "2", "--seconds", "1", "--json"]
    assert kvown_main.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["budget"]["out_of_time"] is True
    assert got["coverage"]["state_share"] == {}


def test_a_switch_out_of_time_reads_as_the_readme_says(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README: 'a switch not caught in it is reported `NO (out of time)`'."""
    monkeypatch.setattr(kvown_main, "_ENTRY_START", [time.monotonic() - SLOW_START])
    rc = kvown_main.main(["fuzz", "--mutant", "reject_unfenced", "--seconds", "5"])
    out = capsys.readouterr().out
    assert rc == 1 and "NO (out of time)" in out, out
    assert "out of time (5 s each): reject_unfenced" in out
    readme = (ROOT / "README.md").read_text()
    assert "a switch not caught in it is reported `NO (out of time)`" in readme
