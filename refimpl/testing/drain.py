"""The end of every example: drain to quiescence, then nothing may be held (issue #16).

A leak that shows only once everything has ended (a block nobody frees, a quarantine
never lifted, a prefix reference never dropped) passes every per-step check. So each
example of the machine ends here: ``drain(harness)`` finds, on the spec alone, a way to
a quiescent terminal state (``spec.properties.quiescent_terminal``: every request ended,
no replica, nothing in flight, no prefix reference) using the protocol's own steps,
timeouts and the client's cancel (no faults, no token steps), and takes it on the
implementation with every check after every step. Then:

- the spec's state is quiescent (the refinement map was checked at every step);
- the implementation holds no block (``Subject.held_blocks()``, the prefix cache's own
  blocks left out), and its ``check_integrity()`` holds.

The search is a depth-first walk of the spec's successors in a fixed order that ends
requests first (cancel, timeouts, cleanups), so it takes a few steps, not a BFS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from refimpl.testing.harness import Harness
from spec.actions import ACTIONS, encode_args, successors
from spec.properties import quiescent_terminal
from spec.state import World, canonical

DRAIN_KINDS = frozenset({"client", "timeout", "local", "recv"})
TOKEN_STEPS = frozenset({"PrefillDecodeStep", "DecodeStep"})  # change no spec state
_ORDER = {"client": 0, "timeout": 1, "recv": 2, "local": 3}
MAX_STATES = 20_000  # spec states the search may visit before it gives up


Skip = Callable[[World, str, int, int], bool]


def drain_path(
    w: World, c: Any, close: Callable[[World], World] | None = None, skip: Skip | None = None
) -> list[tuple[str, dict[str, Any]]] | None:
    """Steps (trace form) from ``w`` to a quiescent terminal state of the correct spec, or
    None when none is found within ``MAX_STATES``. ``close``: each step is followed by
    the steps an implementation takes at once (``api_tour.close``); ``skip(w, name, i,
    arg)``: a step the implementation never takes (``api_tour.declined``)."""
    if quiescent_terminal(w, c):
        return []
    seen = {canonical(w)}
    stack: list[tuple[World, list[tuple[str, dict[str, Any]]]]] = [(w, [])]
    while stack:
        v, path = stack.pop()
        nxt = [
            (name, i, arg, s)
            for name, i, arg, s in successors(v, c, frozenset())
            if ACTIONS[name].kind in DRAIN_KINDS
            and name not in TOKEN_STEPS
            and not (skip is not None and skip(v, name, i, arg))
        ]
        nxt.sort(key=lambda e: (_ORDER[ACTIONS[e[0]].kind], e[0], e[1], e[2]), reverse=True)
        for name, i, arg, s in nxt:  # reversed: the preferred step is popped first
            s = close(s) if close is not None else s
            key = canonical(s)
            if key in seen:
                continue
            seen.add(key)
            step = [*path, (name, encode_args(name, i, arg))]
            if quiescent_terminal(s, c):
                return step
            if len(seen) > MAX_STATES:
                return None
            stack.append((s, step))
    return None


def drain(
    h: Harness, close: Callable[[World], World] | None = None, skip: Skip | None = None
) -> int:
    """Drain ``h`` to quiescence with every check; returns the steps taken. Raises
    ``Divergence`` (kind "drain: ...") on a leak, a broken integrity or no way out."""
    path = drain_path(h.w, h.c, close, skip)
    if path is None:
        h.fail("drain: no way out", "the spec finds no way to a quiescent state from here")
    for name, args in path:
        h.step(name, args)
        h.check_state()
    held_fn = getattr(h.impl, "held_blocks", None)
    held = {k: v for k, v in held_fn().items() if v} if held_fn is not None else {}
    if held:
        h.fail("drain: blocks held", f"quiescent, but blocks are still held: {held}")
    h.check_integrity()
    return len(path)
