"""The worlds of multi-turn append on decode (``spec/behaviours/turns.py``), kept here so
that ``spec/config.py`` stays within its size: ``worlds(Config)`` builds them (this module
imports nothing of ``spec``, so ``spec/config.py`` can import it without a cycle)."""

from __future__ import annotations

from typing import Any

__all__ = ["DEEP", "DEFAULT", "WORLDS", "worlds"]

_WHAT = "the next turn is appended on decode (or falls back to prefill); evictions between turns"
WORLDS: tuple[dict[str, Any], ...] = (
    dict(
        name="turns_append",
        doc=f"one request, 1 block: {_WHAT}",
        blocks=1,
        cap_p=1,
        cap_d=1,
        turns=True,
    ),
    dict(
        name="turns_two",
        doc=f"two requests, 1 block each, prefill fits one, decode both, no cancel: {_WHAT}",
        n_reqs=2,
        blocks=1,
        cap_p=1,
        cap_d=2,
        cancel=False,
        turns=True,
    ),
    dict(
        name="turns_restart",
        doc="one request, 1 block, one attempt, no cancel: a worker may crash once during a"
        " turn or between turns and come back; a session left on decode by a prefill crash"
        " and then evicted while prefill is down fails its turn (pair_restart_turns made"
        " small)",
        blocks=1,
        cap_p=1,
        cap_d=1,
        cancel=False,
        faults=1,
        fault_kinds=frozenset({"crash"}),
        max_attempts=1,
        restarts=1,
        turns=True,
    ),
)
# in the default suite: turns_append about 1 CPU s; turns_restart 415 states (a session
# sent back to prefill while it is down fails: no live request waits for a down prefill)
DEFAULT = ("turns_append", "turns_restart")
DEEP = ("turns_two",)  # in the deep suite (about 27 CPU s, 81,675 states)


def worlds(config_cls: Any) -> list[Any]:
    """The turn worlds as ``config_cls`` instances (``spec.config.Config``)."""
    return [config_cls(**kw) for kw in WORLDS]
