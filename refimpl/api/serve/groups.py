"""Several KV cache groups of one request, handed off together: all committed or none.

A hybrid model keeps its layers in KV cache groups (vLLM's ``kv_cache_groups``: full
attention beside sliding-window attention, or layers of another head count), each with its
own block size, layers and block table. Here each group is its own ``Sender``/``Receiver``
pair over its own pools and geometry, so each group is its own handoff with its own
manifest; ``handoff_groups`` runs them one after the other under one request and makes
them one outcome:

- every group committed: the sources are freed (each group's ``free_source``), and the
  receivers own every group's blocks;
- any group refused or failed: the groups committed before it are given back at the
  receiver (freed there), no source is freed (the request still holds every group's
  blocks at the sender, unpinned, for a retry or a recompute), and the failing group's
  error is raised with a note naming the group.

Within a group the blocks and the transport channels belong to ``group_request(rid,
name)``: the engine allocates group ``name``'s blocks under that holder. A group must hold
the request from its first token: a sliding-window group whose blocks before its window
were freed (vLLM's null blocks) is refused by name, nothing sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from refimpl.api.handoff import HandoffResult, handoff
from refimpl.api.receiver import Receiver
from refimpl.api.sender import Sender


@dataclass(frozen=True, slots=True)
class Group:
    """One KV cache group: its two ends, and the sender's block table for the request."""

    name: str  # the group's name, e.g. "full" or "sliding"
    sender: Sender
    receiver: Receiver
    blocks: Sequence[int] | None = None  # default: every block its holder holds
    decode_room: int = 0  # tokens of room the receiver reserves after the prompt


def group_request(request_id: str, name: str) -> str:
    """The holder (and channel name) of group ``name``'s blocks of ``request_id``."""
    return f"{request_id}#{name}"


def handoff_groups(
    groups: Sequence[Group], request_id: str, token_ids: Sequence[int]
) -> dict[str, HandoffResult]:
    """Hand off every group of ``request_id`` (``token_ids``); all commit or none does.

    Returns each group's result by name. Raises the first failing group's error (every
    group given back at the receiver, every source still held by the request)."""
    names = [g.name for g in groups]
    if not groups or len(set(names)) != len(names):
        raise ValueError(f"handoff_groups: groups {names}; need one or more, distinct names")
    token_ids = list(token_ids)
    for g in groups:
        rid, geo = group_request(request_id, g.name), g.sender.geometry
        held = g.sender.pools.alloc.blocks_of(rid) if g.blocks is None else list(g.blocks)
        need = geo.blocks_for(len(token_ids))
        if len(held) < need:
            raise ValueError(
                f"kv cache group {g.name!r}: {len(held)} blocks for {len(token_ids)} tokens at "
                f"block_size={geo.block_size} (needs {need}); a sliding-window group that "
                "freed its blocks before the window cannot be handed off: kvown blocks hold "
                "a request from its first token"
            )
    done: list[tuple[Group, HandoffResult]] = []
    for g in groups:
        rid = group_request(request_id, g.name)
        try:
            res = handoff(
                g.sender,
                g.receiver,
                rid,
                token_ids,
                blocks=g.blocks,
                decode_room=g.decode_room,
                free_source=False,
            )
        except Exception as e:
            for d, _ in done:  # give back what the groups before it committed
                d.receiver.pools.alloc.free(group_request(request_id, d.name))
                d.receiver.forget(group_request(request_id, d.name))
            e.add_note(
                f"kv cache group {g.name!r} of {request_id!r} failed; groups "
                f"{[d.name for d, _ in done]} committed before it were given back"
            )
            raise
        done.append((g, res))
    for g, _ in done:
        g.sender.pools.alloc.free(group_request(request_id, g.name))
    return {g.name: res for g, res in done}


__all__ = ["Group", "group_request", "handoff_groups"]
