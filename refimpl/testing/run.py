"""Running the machine: settings profiles, runs on a budget, the mutant kill matrix.

Profiles (``register_profiles``; tests/conftest.py loads ``ci`` unless ``HYPOTHESIS_PROFILE``
names another):

    ci       derandomised, no database, bounded: the same examples on every run
    dev      random (the local database replays past failures), a bit more than ci
    nightly  many more examples

``run_machine`` runs one machine class (an adapter, a config, bug switches) to the end of
its budget or its first failure. ``hunt`` repeats runs (new seeds) until a time budget
is spent. ``kill`` judges one switch by the graph tour first (``tour``: the switches of
``tour.KILL_WORLDS``, each on its small world), then hunts with it on, and shrinks the
failing program by delta debugging (``shrink_program``): a replay costs a fraction of a
Hypothesis shrink step.

A time budget is a hard bound: a ``Deadline`` that the machine checks at every step (a
run in progress is interrupted, ``BudgetSpent``; only Hypothesis's replay of a failure
runs to its end), the tour before every sequence and the shrink before every replay.
What was done when it ran out is reported (``RunResult.out_of_time``, ``Kill.out_of_time``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import get_state_machine_test

from refimpl.testing.coverage import state_share as state_share
from refimpl.testing.harness import Adapter, Coverage, Divergence, Step, replay_program
from refimpl.testing.machine import Tally, make_machine
from refimpl.testing.worlds import get_world
from spec.config import Config
from spec.mutants import MUTANTS

_COMMON: dict[str, Any] = dict(deadline=None, stateful_step_count=50)
PROFILES: dict[str, dict[str, Any]] = {
    "ci": dict(max_examples=100, derandomize=True, database=None, **_COMMON),
    "dev": dict(max_examples=100, **_COMMON),
    "nightly": dict(max_examples=2000, **_COMMON),
}
KILL_EXAMPLES = {"ci": 500, "dev": 500, "nightly": 4000}  # per switch, to the first failure
# No "explain" phase (it traces coverage of every shrink step: slow here); no "target"
# phase (the machine does not call target(): hill-climbing one family of examples found
# fewer seeded bugs than fresh generation did).
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
FIND = (Phase.generate,)  # hunts: find, then shrink_program


class BudgetSpent(KeyboardInterrupt):
    """The deadline passed: the run in progress stops at its next step. A
    ``KeyboardInterrupt``: Hypothesis takes it for an interruption, recording nothing;
    any other exception ends the example there, and one cut short while it replayed an
    earlier example's prefix read as ``FlakyStrategyDefinition`` (issue #33). Caught by
    ``run_machine``."""


class Deadline:
    """``seconds`` of wall time from now, or from ``since`` (a ``time.monotonic()`` reading:
    a command's budget counts from its start, imports included); None: no bound."""

    def __init__(self, seconds: float | None, since: float | None = None) -> None:
        start = time.monotonic() if since is None else since
        self.at = None if seconds is None else start + seconds

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def left(self) -> float | None:
        """Seconds left (0 once passed; None: no bound)."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def check(self) -> None:
        if self.passed():
            raise BudgetSpent


NO_DEADLINE = Deadline(None)


def _replaying_the_failure() -> bool:
    """Is Hypothesis replaying the failure it found (one example, recorded however it
    ends: it runs to its end, or the failure would read as another draw)?"""
    try:
        return bool(current_build_context().is_final)
    except InvalidArgument:  # not in a Hypothesis example
        return False


class _Budgeted(Tally):
    """A tally whose step count checks the deadline (not in the replay of a failure)."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        super().__init__()

    @property
    def steps(self) -> int:
        return self._steps

    @steps.setter
    def steps(self, n: int) -> None:
        self._steps = n
        if n and not _replaying_the_failure():
            self.deadline.check()


def register_profiles() -> None:
    for name, kw in PROFILES.items():
        settings.register_profile(name, **kw)


def machine_settings(base: settings | None = None, **overrides: Any) -> settings:
    """Settings for the machine: the given (or the current default) profile, no deadline,
    no health checks (a run's cost is its budget), one bug reported, no explain phase."""
    kw: dict[str, Any] = dict(
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        phases=PHASES,
    )
    kw.update(overrides)
    return settings(base if base is not None else settings.default, **kw)


def profile_settings(name: str, **overrides: Any) -> settings:
    """The machine's settings under profile ``name`` (KeyError naming the valid ones)."""
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; valid profiles: {', '.join(PROFILES)}")
    register_profiles()
    return machine_settings(settings.get_profile(name), **overrides)


@dataclass
class RunResult:
    config: str
    mutants: tuple[str, ...]
    examples: int = 0  # examples started (shrinking included)
    steps: int = 0  # steps taken in all of them
    first_failure: int | None = None  # examples started when the first failure happened
    failure: BaseException | None = None  # what the run raised (a Divergence: the machine's)
    seconds: float = 0.0
    runs: int = 0  # Hypothesis runs (``hunt`` repeats them with new seeds)
    out_of_time: bool = False  # the time budget ended the run

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def program(self) -> list[Step] | None:
        """The failing program, when the machine caught a divergence."""
        return self.failure.program if isinstance(self.failure, Divergence) else None

    def add(self, other: RunResult) -> None:
        if other.first_failure is not None and self.first_failure is None:
            self.first_failure = self.examples + other.first_failure
        self.examples += other.examples
        self.steps += other.steps
        self.failure = self.failure or other.failure
        self.seconds += other.seconds
        self.runs += other.runs
        self.out_of_time = self.out_of_time or other.out_of_time


def run_machine(
    adapter: Adapter,
    config: Config | str,
    mutants: Sequence[str] = (),
    *,
    use: settings | None = None,
    coverage: Coverage | None = None,
    rng_seed: int | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> RunResult:
    """One Hypothesis run of the machine (``use``: its settings, default
    ``machine_settings()``); ``rng_seed`` fixes Hypothesis's choices when the settings
    are not derandomised; ``deadline`` stops it at the next step once passed
    (``out_of_time``). A failure is returned, not raised."""
    c = get_world(config) if isinstance(config, str) else config
    tally = _Budgeted(deadline) if deadline.at is not None else Tally()
    cls = make_machine(adapter, c, mutants, coverage=coverage, tally=tally)
    use = use if use is not None else machine_settings()
    test = get_state_machine_test(cls, settings=use)  # type: ignore[no-untyped-call,unused-ignore]
    if rng_seed is not None:
        test = seed(rng_seed)(test)
    t0 = time.perf_counter()
    failure: BaseException | None = None
    spent = False
    try:
        test()
    except BudgetSpent:
        spent = True
        failure = tally.last  # a divergence caught before (while shrinking) still counts
    except Exception as exc:  # the failure (or Hypothesis's own complaint)
        failure = exc
    return RunResult(
        c.name,
        tuple(sorted(mutants)),
        tally.examples,
        tally.steps,
        tally.first_failure,
        failure,
        time.perf_counter() - t0,
        1,
        spent,
    )


def hunt(
    adapter: Adapter,
    config: Config | str,
    mutants: Sequence[str] = (),
    *,
    profile: str = "ci",
    examples: int | None = None,
    seconds: float | None = None,
    coverage: Coverage | None = None,
    deadline: Deadline | None = None,
) -> RunResult:
    """Run the machine until it fails or the budget is spent. Without ``seconds``: one
    run of ``examples`` (default the profile's). With it: runs of at most 25 examples
    (seeds 1, 2, ... after a derandomised first) until the time is spent (the run in
    progress stopped at its next step), or until ``examples`` when that is given too.
    ``deadline`` (instead of ``seconds``, the same way): a bound shared with the caller's
    other work.
    Quiet, no Hypothesis shrinking (see ``kill``)."""
    c = get_world(config) if isinstance(config, str) else config
    n = examples if examples is not None else int(PROFILES[profile]["max_examples"])
    if deadline is None:
        deadline = Deadline(seconds)
    timed = deadline.at is not None
    batch = min(n, 25) if timed else n
    use = profile_settings(profile, max_examples=batch, phases=FIND, verbosity=Verbosity.quiet)
    total = RunResult(c.name, tuple(sorted(mutants)))
    k = 0
    while True:
        rng = None if k == 0 and use.derandomize else k
        res = run_machine(
            adapter, c, mutants, use=use, coverage=coverage, rng_seed=rng, deadline=deadline
        )
        total.add(res)
        k += 1
        if res.failed or res.out_of_time or not timed:
            return total
        if deadline.passed():
            total.out_of_time = True
            return total
        if examples is not None and total.examples >= n:
            return total


def shrink_program(
    adapter: Adapter,
    config: Config,
    mutants: Sequence[str],
    seed_: int,
    program: list[Step],
    deadline: Deadline = NO_DEADLINE,
) -> tuple[list[Step], Divergence]:
    """Delta debugging on a failing program: drop runs of steps (halves, quarters, ...
    single steps) while a replay still diverges; every replay is cut at its failing step.
    Returns the 1-minimal program and its divergence (once ``deadline`` passed: the
    smallest failing one found so far)."""

    def fails(p: list[Step]) -> Divergence | None:
        try:
            replay_program(adapter, p, config=config, mutants=mutants, seed=seed_)
        except Divergence as err:
            return err
        return None

    err = fails(program)
    if err is None:
        raise AssertionError("the program does not fail on replay: the run is not reproducible")
    best = err.program
    size = max(len(best) // 2, 1)
    while True:
        k, changed = 0, False
        while k < len(best):
            if deadline.passed():
                return best, err
            trial = best[:k] + best[k + size :]
            e = fails(trial) if trial else None
            if e is not None:
                best, err, changed = e.program, e, True
            else:
                k += size
        if size == 1 and not changed:
            return best, err
        size = max(size // 2, 1)


def shrunk(adapter: Adapter, res: RunResult, deadline: Deadline = NO_DEADLINE) -> Divergence | None:
    """The failure of ``res`` with its program shrunk (None when it has none to shrink)."""
    if not isinstance(res.failure, Divergence):
        return None
    where = res.failure.where
    c = get_world(where["config"])
    prog = res.failure.program
    return shrink_program(adapter, c, where["mutants"], where["seed"], prog, deadline)[1]


@dataclass
class Kill:
    name: str
    config: str
    applicable: bool
    killed: bool | None  # None: not applicable here
    steps: int | None = None  # steps in the shrunk counterexample
    examples: int | None = None  # examples run until the first failure
    seconds: float = 0.0
    message: str = ""  # the shrunk failure's first line
    program: list[Step] = field(default_factory=list)  # the shrunk counterexample
    seed: int = 0  # the implementation's seed it replays with
    caught: str = ""  # which check caught it, at which action
    by: str = "fuzz"  # the judge: "tour" (the graph tour, ``tour``) or "fuzz" (the machine)
    out_of_time: bool = False  # the budget ran out (a survivor: not caught in the time)

    def to_json(self) -> dict[str, Any]:
        killed: bool | str = "n/a" if self.killed is None else self.killed
        return {
            "name": self.name,
            "killed": killed,
            "steps": self.steps,
            "examples": self.examples,
            "by": self.by,
            "out_of_time": self.out_of_time,
        }


def mutant_config(name: str) -> str:
    """Where a switch is hunted: its spec mutant's first config (the stream switch: a
    config with offload, where reloads run)."""
    mu = MUTANTS.get(name)
    return mu.configs[0] if mu is not None else "offload_contend"


def kill(
    adapter: Adapter,
    name: str,
    *,
    profile: str = "ci",
    examples: int | None = None,
    seconds: float | None = None,
    tour: bool = True,
    deadline: Deadline | None = None,
) -> Kill:
    """Judge switch ``name``: by the graph tour first (``tour.tour_kill``: deterministic;
    the switches of ``tour.KILL_WORLDS``), then, when it survives the tour (or ``tour`` is
    False), by a hunt of the machine (``KILL_EXAMPLES`` of the profile by default); killed
    when either fails. The failing program is shrunk by ``shrink_program``. ``seconds``:
    the whole judgement's bound (tour, hunt and shrink); a switch not caught in it
    survives with ``out_of_time``. ``deadline`` (instead of ``seconds``): that bound, set
    by the caller (a command's first switch: from the command's start)."""
    cname = mutant_config(name)
    if not adapter.switches().get(name, False):
        return Kill(name, cname, False, None, message="not applicable here")
    if deadline is None:
        deadline = Deadline(seconds)
    t0 = time.perf_counter()
    if tour:
        from refimpl.testing.tour import KILL_WORLDS, tour_kill

        if name in KILL_WORLDS:  # a small world, measured: the tour is seconds
            judged: Kill = tour_kill(adapter, name, deadline=deadline)
            if judged.killed or deadline.passed():
                judged.out_of_time = not judged.killed
                return judged
    n = examples if examples is not None else KILL_EXAMPLES[profile]
    res = hunt(adapter, cname, (name,), profile=profile, examples=n, deadline=deadline)
    took = time.perf_counter() - t0
    if res.failure is None:
        return Kill(name, cname, True, False, seconds=took, out_of_time=res.out_of_time)
    err = shrunk(adapter, res, deadline)
    took = time.perf_counter() - t0
    if err is None:
        first = f"{type(res.failure).__name__}: {res.failure}".splitlines()[0]
        return Kill(name, cname, True, True, None, res.first_failure, took, first)
    first = str(err).splitlines()[0]
    return Kill(
        name,
        cname,
        True,
        True,
        len(err.program),
        res.first_failure,
        took,
        first,
        err.program,
        int(err.where["seed"]),
        f"{err.kind}: {err.program[-1]['action']}" if err.program else err.kind,
    )
