"""Crash tests with real processes: writers killed with SIGKILL at chosen or random
points, then a restart that must read nothing half-written and lose nothing published.
``disk``: the disk tier's (``refimpl.tiers``, ``refimpl.api.disk.DiskTier``)."""

from refimpl.testing.crash.disk import PHASES, kill_at, kill_rounds

__all__ = ["PHASES", "kill_at", "kill_rounds"]
