"""A step in flight, and the guard every freeing or freezing action asks first.

The step actions are in ``async_steps``; this module imports no action module, so the
prefill and decode actions can call ``step_guard``.
"""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.engine.base import EngineBase
from refimpl.errors import FrozenError, InUseError

__all__ = ["InFlight", "step_guard"]

# the guard a refused action names, and the mutant that removes it
_GUARDS = {
    "free": (InUseError, "free_with_step_in_flight"),
    "preempt": (InUseError, "preempt_with_step_in_flight"),
    "freeze": (FrozenError, "freeze_with_step_in_flight"),
}


@dataclass(frozen=True, slots=True)
class InFlight:
    """A step dispatched and not yet completed."""

    forward: bool  # the prefill forward pass (else one token's decode step)
    blocks: tuple[int, ...]  # the block table it was dispatched with (logical order)
    slot: tuple[int, int] | None  # (logical block, slot) of its token; None: writes none
    token: int  # the token's index (``ReqState.steps`` at dispatch)


def step_guard(eng: EngineBase, i: int, worker: str, what: str) -> None:
    """Refuse to ``what`` ("free", "preempt" or "freeze") request i's replica on
    ``worker`` ("p" or "d") while a step of it is in flight there (unless the mutant
    that removes this guard is on)."""
    steps: dict[tuple[int, str], InFlight] = getattr(eng, "inflight", {})
    if not eng.config.async_steps or (i, worker) not in steps:
        return
    err, mutant = _GUARDS[what]
    if mutant not in eng.m:
        raise err(f"a step of r{i} is in flight on {worker}: it still writes its blocks")
