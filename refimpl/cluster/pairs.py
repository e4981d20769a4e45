"""The data plane: one gloo process group per (prefill rank, decode worker) pair and
incarnation pair, so that a restarted worker joins without re-forming a world.

A torch.distributed world cannot take a process back once one of its members died. Each
pair therefore has its own two-member ``ProcessGroupGloo`` (rank 0: the prefill rank,
rank 1: the decode worker), rendezvoused through the router's TCPStore under the prefix
``pg/{p}.{p_inc}-{d}.{d_inc}/``. A restart gives its worker a new incarnation and so
new groups: the dead incarnation's groups are dropped, and a late write of the old
incarnation has no group to land through (the spec's fencing of old registrations, and
``restart_keeps_pool`` is the mutant of reusing one).

Groups are created in one global order, by (prefill rank, decode worker), on both ends,
so concurrent creations never wait on each other in a cycle. Every creation and every
transfer is bounded by a timeout.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from refimpl.cluster.control import Store


def pair_prefix(p: str, p_inc: int, d: str, d_inc: int) -> str:
    return f"pg/{p}.{p_inc}-{d}.{d_inc}/"


class Pairs:
    """One process's ends of its pair groups, keyed by peer name."""

    def __init__(self, store: Store, me: str, timeout_s: float) -> None:
        self.store, self.me = store, me
        self.prefill = me.startswith("p")
        self.timeout = timedelta(seconds=timeout_s)
        self.groups: dict[str, tuple[int, Any]] = {}  # peer -> (peer_inc, group)
        self.retired: list[Any] = []  # dead incarnations' groups (never destroyed:
        # a gloo destructor may wait on a send to a dead peer)

    def connect(self, my_inc: int, peer: str, peer_inc: int) -> bool:
        """Join the pair group with ``peer``'s incarnation (blocks until it joins, within
        the timeout); False if it did not."""
        old = self.groups.pop(peer, None)
        if old is not None:
            self.retired.append(old[1])
        p, pi, d, di = (
            (self.me, my_inc, peer, peer_inc) if self.prefill else (peer, peer_inc, self.me, my_inc)
        )
        try:
            pg = dist.ProcessGroupGloo(
                dist.PrefixStore(pair_prefix(p, pi, d, di), self.store),  # type: ignore[attr-defined]
                0 if self.prefill else 1,
                2,
                self.timeout,
            )
        except RuntimeError:
            return False
        self.groups[peer] = (peer_inc, pg)
        return True

    def forget(self, peer: str) -> None:
        old = self.groups.pop(peer, None)
        if old is not None:
            self.retired.append(old[1])

    def isend(self, peer: str, data: torch.Tensor, tag: int) -> Any:
        """Post a send to ``peer`` (None: no group with it, it is down)."""
        g = self.groups.get(peer)
        if g is None:
            return None
        return g[1].send([data], 1 if self.prefill else 0, tag)

    def irecv(self, peer: str, buf: torch.Tensor, tag: int) -> Any:
        g = self.groups.get(peer)
        if g is None:
            return None
        return g[1].recv([buf], 1 if self.prefill else 0, tag)
