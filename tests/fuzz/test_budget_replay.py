"""A time budget that runs out inside an example is no failure (issue #33).

Hypothesis mutates a passing example into new ones that share a prefix of its choices;
a budget that ran out while such an example was still on that prefix used to end the
example there (``BudgetSpent`` raised inside it), and Hypothesis, which had the earlier
example draw more on the same choices, ended the run in ``FlakyStrategyDefinition``
("the second run stopped drawing earlier than the first"), reported as a divergence.
The deadline here passes at exactly that moment, whenever the timing would have made it:
no clock is read, so the run is the same every time."""

from __future__ import annotations

from typing import Any

from hypothesis import Verbosity
from hypothesis.control import current_build_context

from refimpl.testing import Divergence, EngineAdapter
from refimpl.testing.run import FIND, Deadline, profile_settings, run_machine

ADAPTER = EngineAdapter()
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
