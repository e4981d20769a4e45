"""Hypothesis settings profiles (``refimpl/testing/run.py``): ``ci`` (derandomised, bounded)
by default, so the README's test command gives the same result on every machine;
``HYPOTHESIS_PROFILE`` picks ``dev`` or ``nightly`` (randomised, more examples) instead."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from refimpl.testing.run import register_profiles

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nightly: a long run (minutes of CPU) left to the nightly job; runs when KVOWN_NIGHTLY=1",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVOWN_NIGHTLY") == "1":
        return
    skip = pytest.mark.skip(reason="nightly: KVOWN_NIGHTLY=1 runs it")
    for item in items:
        if item.get_closest_marker("nightly") is not None:
            item.add_marker(skip)
