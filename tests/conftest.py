"""Hypothesis settings profiles (``refimpl/testing_run.py``): ``ci`` (derandomised, bounded)
when the ``CI`` environment variable is set, else ``dev``; ``HYPOTHESIS_PROFILE`` picks any
of ``ci``, ``dev``, ``nightly`` explicitly."""

from __future__ import annotations

import os

from hypothesis import settings

from refimpl.testing_run import register_profiles

register_profiles()
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)
