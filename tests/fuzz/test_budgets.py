"""A time budget is a hard bound (issue #35): the machine checks the deadline at every
step, so a Hypothesis run in progress stops at once; the tour checks it before every
sequence; a switch not caught in its budget is reported as out of time, not as killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from refimpl.testing import EngineAdapter
from refimpl.testing.run import Deadline, hunt, kill
from refimpl.testing.tour import KILL_WORLDS

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = EngineAdapter()


def test_a_passed_deadline_stops_the_run_in_progress_at_its_first_step() -> None:
    res = hunt(ADAPTER, "offload_contend", deadline=Deadline(0.0))
    assert res.out_of_time and not res.failed
    assert (res.runs, res.examples, res.steps) == (1, 1, 1)  # not the 25 examples of a batch


def test_no_deadline_runs_the_examples() -> None:
    res = hunt(ADAPTER, "offload_contend", examples=3)
    assert not res.out_of_time and res.examples >= 3


def test_a_switch_not_caught_in_its_budget_is_out_of_time_not_killed() -> None:
    toured = next(iter(KILL_WORLDS))  # judged by the tour first
    hunted = "reject_unfenced"  # no kill world: judged by the hunt
    assert hunted not in KILL_WORLDS
    for name in (toured, hunted):
        k = kill(ADAPTER, name, seconds=1e-9)
        assert (k.applicable, k.killed, k.out_of_time) == (True, False, True), name
        assert k.to_json()["out_of_time"] is True


def test_reject_unfenced_is_killed_within_its_budget_from_the_command_line() -> None:
    """It used to be toured on reject_dup (124,764 edges): 400 s past a 120 s budget."""
    r = subprocess.run(
        [sys.executable, "-m", "kvown_cli.main", "fuzz", "--mutant", "reject_unfenced"]
        + ["--seconds", "120", "--json"],  # from the start: imports took 57 s at load 19
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (got,) = json.loads(r.stdout)["mutants"]
    assert got["killed"] is True and got["out_of_time"] is False, got


def test_the_tour_stops_at_its_budget_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from kvown_cli.main import main

    rc = main(["fuzz", "--tour", "--config", "offload_contend", "--seconds", "0.001", "--json"])
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert rc == 1 and got["out_of_time"] is True and got["complete"] is False
    assert "budget ran out" in out.err
