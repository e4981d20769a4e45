"""A time budget is a hard bound (issue #35): the machine checks the deadline at every
step, so a Hypothesis run in progress stops at once; the tour checks it before every
sequence; a switch not caught in its budget is reported as out of time, not as killed.

A time budget that runs out inside an example is no failure (issue #33): Hypothesis
mutates a passing example into new ones that share a prefix of its choices; a budget
that ran out while such an example was still on that prefix used to end the example
there, and Hypothesis, which had the earlier example draw more on the same choices,
ended the run in ``FlakyStrategyDefinition`` ("the second run stopped drawing earlier
than the first"), reported as a divergence. The deadlines below pass at exactly that
moment, whenever the timing would have made it: no clock is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Verbosity
from hypothesis.control import current_build_context

from refimpl.testing import Divergence, EngineAdapter
from refimpl.testing.run import FIND, Deadline, hunt, kill, profile_settings, run_machine
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


# ---- a budget spent inside an example (issue #33)
# Short examples, so that Hypothesis's first mutations (after 10 valid examples) come soon.
USE = profile_settings(
    "ci", max_examples=25, phases=FIND, verbosity=Verbosity.quiet, stateful_step_count=10
)


def _choices() -> tuple[Any, ...]:
    return tuple(current_build_context().data.choices)


class OnARecordedPrefix(Deadline):
    """Passes at the first step check where the example in progress has drawn a strict
    prefix of the choices an earlier example drew (a replay of that prefix)."""

    def __init__(self) -> None:
        super().__init__(3600.0)  # bounded, so the machine checks it at every step
        self.done: list[tuple[Any, ...]] = []  # the choices of the examples before
        self.data: object = None
        self.fired = False

    def passed(self) -> bool:
        data = current_build_context().data
        if data is not self.data:  # a new example: the last one is done
            if self.data is not None:
                self.done.append(tuple(self.data.choices))  # type: ignore[attr-defined]
            self.data = data
        cur = _choices()
        self.fired = self.fired or any(
            len(c) > len(cur) and c[: len(cur)] == cur for c in self.done
        )
        return self.fired


class DuringTheFinalReplay(Deadline):
    """Passes once Hypothesis replays the failure it found, to report it."""

    def __init__(self) -> None:
        super().__init__(3600.0)

    def passed(self) -> bool:
        return bool(current_build_context().is_final)


def test_a_budget_spent_on_a_replayed_prefix_ends_the_run_without_a_failure() -> None:
    deadline = OnARecordedPrefix()
    res = run_machine(ADAPTER, "offload_contend", use=USE, deadline=deadline)
    assert deadline.fired, "no example replayed a prefix: the test no longer tests it"
    assert res.out_of_time and res.failure is None, repr(res.failure)
    assert res.examples > 10  # it stopped in one of Hypothesis's mutations


def test_the_replay_of_a_failure_runs_to_its_end_past_the_budget() -> None:
    """Hypothesis records its replay of a failure however it ends: cut short by the
    budget, it read as a different draw (``FlakyStrategyDefinition``) in place of the
    divergence. The replay is one example: it runs to its end, and the divergence is the
    run's failure."""
    res = run_machine(
        ADAPTER,
        "handoff_tp2to1",
        ["free_on_cancel_in_flight"],
        use=USE,
        deadline=DuringTheFinalReplay(),
    )
    assert isinstance(res.failure, Divergence), repr(res.failure)
    assert res.first_failure is not None and not res.out_of_time
