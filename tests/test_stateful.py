"""The shipped machine (``refimpl.testing``) on the correct reference engine, on every
default config, under the loaded Hypothesis profile (``ci`` in CI)."""

from __future__ import annotations

import pytest

from refimpl.testing import Coverage, EngineAdapter
from refimpl.testing_harness import NONTRIVIAL
from refimpl.testing_run import run_machine
from spec.actions import ACTIONS
from spec.config import DEFAULT_SUITE

SUITE = Coverage()  # summed over the runs below (pytest runs them in file order)
RAN: set[str] = set()


@pytest.mark.parametrize("name", DEFAULT_SUITE)
def test_the_engine_conforms_to_the_spec(name: str) -> None:
    res = run_machine(EngineAdapter(), name, coverage=SUITE)
    if res.failure is not None:
        raise res.failure
    RAN.add(name)


def test_the_suite_takes_every_action_and_presses_every_property() -> None:
    if RAN != set(DEFAULT_SUITE):
        pytest.skip("needs every run above in this session")
    assert [a for a in ACTIONS if not SUITE.accepted[a]] == []
    assert [p for p in NONTRIVIAL if not SUITE.properties[p]] == []
