"""The shipped machine (``refimpl.testing``) on the correct reference engine, on every
default config, under the loaded Hypothesis profile (``ci`` in CI). Each test is the
machine's own Hypothesis test: ``--hypothesis-show-statistics`` lists its events."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import get_state_machine_test

from refimpl.testing import Coverage, EngineAdapter, make_machine
from refimpl.testing.harness import NONTRIVIAL
from refimpl.testing.run import machine_settings
from spec.actions import ACTIONS
from spec.config import CONFIGS, DEFAULT_SUITE

SUITE = Coverage()  # summed over the machines below
MACHINES = {n: make_machine(EngineAdapter(), CONFIGS[n], coverage=SUITE) for n in DEFAULT_SUITE}
for _name, _machine in MACHINES.items():
    globals()[f"test_the_engine_conforms_on_{_name}"] = get_state_machine_test(
        _machine, settings=machine_settings()
    )


def test_the_suite_takes_every_action_and_presses_every_property() -> None:
    """After the machines above (pytest runs a module's tests in order); skipped when
    they have not all run in this session."""
    if any(m.tally.examples == 0 for m in MACHINES.values()):
        pytest.skip("needs every machine above to have run in this session")
    if not settings.default.derandomize:  # a random profile may miss a rare fault by chance
        pytest.skip("pinned for the derandomised ci profile only")
    assert [a for a in ACTIONS if not SUITE.accepted[a]] == []
    assert [p for p in NONTRIVIAL if not SUITE.properties[p]] == []
