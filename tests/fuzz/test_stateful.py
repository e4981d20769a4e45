"""The shipped machine (``refimpl.testing``) on the correct reference engine, on every
default config, under the loaded Hypothesis profile (``ci`` in CI). Each test is the
machine's own Hypothesis test: ``--hypothesis-show-statistics`` lists its events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import get_state_machine_test

from refimpl.testing import Coverage, EngineAdapter, make_machine
from refimpl.testing.harness import NONTRIVIAL
from refimpl.testing.run import machine_settings
from spec.actions import ACTIONS
from spec.config import CONFIGS, DEFAULT_SUITE
from tests.conftest import suite_examples

SUITE = Coverage()  # summed over the machines below
# turns_append is left to its deterministic tour (tests/behaviours/test_turns.py): its
# machine cost 40 CPU s here; the nightly kill matrix runs it (tests/fuzz/test_fuzz_mutants.py).
MACHINES = {
    n: make_machine(EngineAdapter(), CONFIGS[n], coverage=SUITE)
    for n in DEFAULT_SUITE
    if n != "turns_append"
}
# In the suite (the derandomised ci profile) SUITE_EXAMPLES per world (tests/conftest.py:
# the graph tour holds the coverage and the kill matrix deterministically, the walk adds
# data and interleavings); the nightly job (KVOWN_NIGHTLY=1) runs the profile's all.
_N = suite_examples()
_SUITE_SETTINGS = machine_settings() if _N is None else machine_settings(max_examples=_N)
for _name, _machine in MACHINES.items():
    globals()[f"test_the_engine_conforms_on_{_name}"] = get_state_machine_test(
        _machine, settings=_SUITE_SETTINGS
    )


# The coverage pin is held in the suite by the graph tour (tests/fuzz/test_tour.py: every
# action taken, every property pressed, no exception). The nightly run below pins the
# random walk and the tour together: nothing either leaves out.
NOT_REACHED: frozenset[str] = frozenset()
NOT_PRESSED: frozenset[str] = frozenset()

_COVERAGE_RUN = """
import json
from hypothesis import settings
from hypothesis.stateful import get_state_machine_test
from refimpl.testing import Coverage, EngineAdapter, make_machine
from refimpl.testing.run import machine_settings, register_profiles
from spec.config import CONFIGS, DEFAULT_SUITE
register_profiles()
settings.load_profile("ci")
cov = Coverage()
for name in DEFAULT_SUITE:
    m = make_machine(EngineAdapter(), CONFIGS[name], coverage=cov)
    get_state_machine_test(m, settings=machine_settings())()
from refimpl.testing.tour import plan_tour, run_tour
from refimpl.testing.worlds import get_world
from tests.fuzz.test_tour import COVERAGE_TOURS, SCAN
for name in COVERAGE_TOURS:
    cov.merge(run_tour(EngineAdapter(), plan_tour(get_world(name), "pairs", scan=SCAN)).coverage)
print(json.dumps({"accepted": sorted(a for a in cov.accepted if cov.accepted[a]),
                  "properties": sorted(p for p in cov.properties if cov.properties[p])}))
"""


@pytest.mark.nightly  # every default world's machine again, in a fresh process: ~340 CPU s
def test_the_suite_takes_every_action_and_presses_every_property() -> None:
    """The machines above, under the derandomised ci profile, in a fresh interpreter,
    and the suite's pair tours (which take what the random walk may miss).

    Fresh, because the examples a derandomised run draws turned out to depend on the
    process's history (importing ``kvown_cli.main`` first changed them, and EnvCorrupt
    was then never accepted): the pin holds for a clean process, where it is
    reproducible. Skipped under a random profile, which may miss a rare fault by chance.
    """
    if not settings.default.derandomize:
        pytest.skip("pinned for the derandomised ci profile only")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", _COVERAGE_RUN],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    missed = [a for a in ACTIONS if a not in got["accepted"]]
    assert [a for a in missed if a not in NOT_REACHED] == []
    assert [p for p in NONTRIVIAL if p not in got["properties"] and p not in NOT_PRESSED] == []
