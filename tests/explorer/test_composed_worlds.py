"""Behaviours that compose (issue #32 item 2; SPEC.md, "Behaviours that compose"): a small
world per interacting pair and one with every behaviour on, each exploring to its pinned
outcome with every property and INVARIANTS.md conjunct holding."""

from __future__ import annotations

import pytest

from model_checks.explicit.pin import load, measure_config
from model_checks.explicit.runner import check_config
from spec.behaviours.compose import BEHAVIOURS
from spec.behaviours.worlds import COMPOSED, PAIRS
from spec.config import CONFIGS, DEEP_SUITE, DEFAULT_SUITE, Config

ALL = "all_behaviours"


def test_the_composed_worlds_are_in_the_deep_suite_and_pinned() -> None:
    deep = load()["deep"]
    for name in COMPOSED:
        assert name in DEEP_SUITE and name not in DEFAULT_SUITE
        assert deep[name]["result"] == "holds"


@pytest.mark.parametrize("name", PAIRS)
def test_each_pair_holds_at_its_pin(name: str) -> None:
    assert measure_config(name) == load()["deep"][name]


def test_a_pair_world_breaks_no_conjunct() -> None:
    r = check_config("pair_crash_host")
    assert not r.violations


def test_the_all_behaviours_world_switches_every_behaviour_on() -> None:
    c = CONFIGS[ALL]
    base = Config("x", "x")
    for b, switches in BEHAVIOURS.items():
        if b in ("no_cancel", "host_cache"):  # cancel stays; the warm cache is host_cache 2
            continue
        for f, v in switches.items():
            assert getattr(c, f) == v, (b, f)
    assert c.restarts and c.host_cache == 2 and c.dst_tp == 2 and c.prefix
    assert base.revocable and not c.revocable


@pytest.mark.nightly
def test_the_all_behaviours_world_holds_at_its_pin() -> None:
    assert measure_config(ALL) == load()["deep"][ALL]
