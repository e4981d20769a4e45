"""What the API adapter reads of a decode side, as functions of its ``Receiver``.

The refinement map and the checks read the Receiver's attempt and its pools (read only).
Each read is a function here, named in ``VIEWS``, so that the same code answers it where
the Receiver lives: in process (``view(rx, name, ...)`` calls it) or in the decode
process of the tour across processes (``on_api.remote``: the proxy asks that process to
call it). Values are plain (ints, strings, lists), to cross a process boundary as JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from refimpl.api.abstract import receiver_part
from refimpl.api.receiver import Receiver
from refimpl.api.wire import State

__all__ = ["VIEWS", "view"]


def attempt_held(rx: Receiver, rid: str) -> bool:
    """Does the request's attempt hold decode blocks (receiving, or committed and kept)?"""
    a = rx._att.get(rid)  # noqa: SLF001 - a refinement map reads the end's state
    if a is None:
        return False
    return a.state is State.RECEIVING or (
        a.state is State.DONE and bool(rx.pools.alloc.blocks_of(rid))
    )


def attempt_epoch(rx: Receiver, rid: str) -> int | None:
    a = rx._att.get(rid)  # noqa: SLF001
    return None if a is None else int(a.m.epoch)


def quarantined(rx: Receiver, rid: str) -> bool:
    """Are an ended attempt's blocks quarantined (an unrevocable transport)?"""
    return rid in rx.quarantined()


def installed_layers(rx: Receiver, rid: str, layers: int) -> int:
    """Layers installed in the blocks the engine reads (the spec's ``inl``)."""
    a = rx._att.get(rid)  # noqa: SLF001
    if a is None:
        return 0
    if a.state is State.DONE:
        return layers
    s = a.stream
    if s is None:
        return 0
    if a.staging is not None:
        return len(a.unstaged)
    whole = all(
        (r, j, k) in s.landed
        for r in s.ranks
        for j in range(s.num_blocks)
        for k in range(s.num_layers)
    )
    return layers if whole and s.landed else 0


def ends(rx: Receiver) -> list[list[Any]]:
    """Every attempt's (request, state, epoch, layer chunks landed), for a snapshot."""
    return [
        [k, a.state.value, a.m.epoch, len(a.stream.landed) if a.stream else 0]
        for k, a in rx._att.items()  # noqa: SLF001
    ]


def pool_snapshot(rx: Receiver) -> list[Any]:
    """The decode pool's counts, holders and a sum of its bytes, for a snapshot."""
    p = rx.pools
    return [
        repr(p.alloc.counts()),
        repr(tuple(p.alloc.holders())),
        float(p.gather(range(p.alloc.capacity)).sum().item()),
    ]


def pool_used(rx: Receiver) -> int:
    return int(rx.pools.alloc.capacity - rx.pools.alloc.num_free)


def blocks_of(rx: Receiver, rid: str) -> list[int]:
    return list(rx.pools.alloc.blocks_of(rid))


def pool_integrity(rx: Receiver) -> None:
    rx.pools.alloc.check_integrity()


def part(rx: Receiver, rid: str, per_rank: int) -> dict[str, int]:
    return receiver_part(rx, rid, per_rank)


VIEWS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        attempt_held,
        attempt_epoch,
        quarantined,
        installed_layers,
        ends,
        pool_snapshot,
        pool_used,
        blocks_of,
        pool_integrity,
        part,
    )
}


def view(rx: Any, name: str, *args: Any) -> Any:
    """``VIEWS[name](rx, *args)`` where ``rx`` lives: here, or in its decode process."""
    remote = getattr(rx, "remote_view", None)
    if remote is not None:
        return remote(name, list(args))
    return VIEWS[name](rx, *args)
