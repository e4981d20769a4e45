"""Hypothesis settings profiles (``refimpl/testing/run.py``): ``ci`` (derandomised, bounded)
by default, so the README's test command gives the same result on every machine;
``HYPOTHESIS_PROFILE`` picks ``dev`` or ``nightly`` (randomised, more examples) instead."""

from __future__ import annotations

import os

from hypothesis import settings

from refimpl.testing.run import register_profiles

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")
