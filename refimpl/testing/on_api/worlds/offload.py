"""Offload and reload on the API (``Config.offload``): a mixin of ``ApiSubject``.

The host tier is host pools of the prefill geometry (``cap_h`` blocks, prefill TP 1);
each move is ``refimpl.api.offload``'s stepwise ``Handoff`` (``begin_offload`` /
``begin_reload``: its own Sender and Receiver over a private in-process transport):

    PrefillOffloadBegin   ``begin_offload(free_device=True)`` and one round: the host
                          blocks reserved, every chunk sent (the eager
                          ``PrefillOffloadCopy`` of every block: the spec's copies)
    PrefillOffloadCommit  one round: the host Receiver verifies and commits, its ack
                          reaches the Sender, which frees the device blocks
    PrefillReloadBegin    ``begin_reload(free_host=True, checksums=)`` (the host copy's
                          checksums taken at its commit) and one round: the device
                          blocks reserved under the request, every chunk sent (the eager
                          ``PrefillReloadCopy``)
    PrefillReloadCommit   one round: committed on the device, the host copy freed
    EnvStoreFail          ``Handoff.abort``: the host blocks given back, the device copy
                          thawed
    PrefillQuiesce        (an ended request) the move aborted, the host copy freed
    EnvCrash (prefill)    the host pools are the prefill process's memory: reset

The refinement map (``refimpl.api.abstract.tier_part``) reads the moves' ends and the
host pools; the scheduler's checks (a write to a replica an offload reads, a reload's
reserved blocks) read the moves, as the engine author's scheduler would.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.api.abstract import tier_part
from refimpl.api.handoff import Handoff
from refimpl.api.offload import begin_offload, begin_reload
from refimpl.engine.data import RankPools
from refimpl.errors import CapacityError, OwnershipError
from spec.config import Config
from spec.state import RUNNING

__all__ = ["OffloadActions"]

STORE_FAILED = "the store to host failed"


class OffloadActions:
    """The offload actions and the host tier's registers; the rest is ``ApiActions``'s."""

    c: Config
    n: int
    pp: list[RankPools]
    gp: Any
    tx_kw: dict[str, Any]
    st: list[int]
    faults: int
    p_up: bool
    rid: Any
    _need: Any
    token_ids: Any
    sender_view: Any

    def offload_init(self, n: int) -> None:
        """Host pools (none where the world has no offload), no move, no move counted."""
        self.hp = [self.gp.make_rank_pools(0, self.c.cap_h)] if self.c.offload else []
        self.moves: list[tuple[str, Handoff] | None] = [None] * n
        self.mv = [0] * n
        self.sums: list[list[str] | None] = [None] * n  # the host copy's, at its commit

    # ------------------------------------------------------------ the map
    def tier_fields(self, i: int) -> dict[str, int]:
        """h, hl, gl, mv and (a move in progress) p of request i."""
        if not self.hp:  # no host tier: a preemption still counts a move (the spec's mv)
            return {"mv": self.mv[i]} if self.c.recompute else {}
        rid = self.rid(i)
        host, device = (bool(p.alloc.blocks_of(rid)) for p in (self.hp[0], self.pp[0]))
        out = tier_part(self.moves[i], host, device, self.c.blocks)
        out["mv"] = self.mv[i]
        return out

    def move_of(self, i: int, kind: str) -> Handoff | None:
        m = self.moves[i]
        return m[1] if m is not None and m[0] == kind and not m[1].final else None

    def tier_busy(self, i: int) -> None:
        """The scheduler's part before it writes, finishes or hands off the device copy:
        an offload reads it (read-only: FrozenSnapshot), a reload's blocks are reserved
        (not the request's yet: not enabled), a host copy exists (not enabled)."""
        if self.move_of(i, "offload") is not None:
            raise OwnershipError(
                f"{self.rid(i)}: an offload reads its blocks", prop="FrozenSnapshot"
            )
        self._need(self.move_of(i, "reload") is None, "a reload is in progress")

    def host_free(self, i: int) -> bool:
        """No move and no host copy of request i."""
        return self.moves[i] is None and not (self.hp and self.hp[0].alloc.blocks_of(self.rid(i)))

    def host_replica(self, i: int) -> torch.Tensor | None:
        blocks = self.hp[0].alloc.blocks_of(self.rid(i)) if self.hp else ()
        return self.hp[0].gather(blocks) if blocks else None

    # ------------------------------------------------------------ actions
    def _running(self, i: int) -> None:
        self._need(self.c.offload and self.p_up and self.st[i] == RUNNING, "not running")

    def _offload_ready(self, i: int) -> Any:
        """PrefillOffloadBegin's guards, whatever the tier (host pools or a DiskTier)."""
        self._running(i)
        rid = self.rid(i)
        self.tier_busy(i)
        self._need(self.host_free(i), "a host copy exists")
        self._need(bool(self.pp[0].alloc.blocks_of(rid)), "no device copy")
        self._need(not self.sender_view(i)["live"], "a handoff reads the device copy")
        self._need(self.mv[i] < self.c.max_moves, "no move left")
        return rid

    def _PrefillOffloadBegin(self, i: int, arg: int) -> None:
        rid = self._offload_ready(i)
        if self.hp[0].alloc.num_free < self.c.blocks:
            raise CapacityError(f"{rid}: {self.hp[0].alloc.num_free} host blocks free")
        kw = {"mutants": self.tx_kw["mutants"]} if "mutants" in self.tx_kw else {}
        h = begin_offload(
            self.pp[0], self.gp, self.hp[0], self.gp, rid, self.token_ids(),
            free_device=True, epoch=self.mv[i] + 1, **kw,
        )  # fmt: skip
        h.round()
        self.moves[i] = ("offload", h)
        self.mv[i] += 1

    def _commit(self, i: int, kind: str) -> None:
        self._running(i)
        h = self.move_of(i, kind)
        self._need(h is not None, f"no {kind} in progress")
        assert h is not None
        h.round()
        h.result()  # the committed move, or its error raised (a divergence)
        self.moves[i] = None
        if kind == "offload":  # the host copy's checksums as committed: a reload checks them
            self.sums[i] = self.hp[0].checksums(self.hp[0].alloc.blocks_of(self.rid(i)))

    def _PrefillOffloadCommit(self, i: int, arg: int) -> None:
        self._commit(i, "offload")

    def _PrefillReloadBegin(self, i: int, arg: int) -> None:
        self._running(i)
        rid = self.rid(i)
        if self.move_of(i, "offload") is not None:
            raise OwnershipError(f"{rid}: its store is in flight", prop="LoadXorStore")
        self._need(self.moves[i] is None and bool(self.hp[0].alloc.blocks_of(rid)), "no host copy")
        self._need(not self.pp[0].alloc.blocks_of(rid), "a device copy exists")
        if self.pp[0].alloc.num_free < self.c.blocks:
            raise CapacityError(f"{rid}: {self.pp[0].alloc.num_free} device blocks free")
        h = begin_reload(
            self.hp[0], self.gp, self.pp[0], self.gp, rid, self.token_ids(),
            free_host=True, epoch=self.mv[i] + 1, checksums=self.sums[i],
        )  # fmt: skip
        h.round()
        self.moves[i] = ("reload", h)

    def _PrefillReloadCommit(self, i: int, arg: int) -> None:
        self._commit(i, "reload")

    def _EnvStoreFail(self, i: int, arg: int) -> None:
        ok = "store_fail" in self.c.fault_kinds and self.faults < self.c.faults
        self._need(ok and self.p_up, "no fault left")
        h = self.move_of(i, "offload")
        self._need(h is not None, "no store in flight")
        assert h is not None
        h.abort(STORE_FAILED)
        self.moves[i] = None
        self.faults += 1

    def quiesce_tier(self, i: int) -> None:
        """An ended request's moves stop (``Handoff.abort``) and its host copy goes."""
        m = self.moves[i]
        if m is not None and not m[1].final:
            m[1].abort("cancelled")
        self.moves[i] = None
        if self.hp:
            self.hp[0].alloc.free(self.rid(i))

    def crash_tier(self) -> None:
        """The prefill process died: its host memory and its moves are gone."""
        for hp in self.hp:
            hp.reset()
        self.moves = [None] * self.n

    def tier_snapshot(self) -> object:
        pools = tuple((repr(p.alloc.counts()), tuple(p.alloc.holders())) for p in self.hp)
        moves = tuple(None if m is None else (m[0], m[1].final, m[1].rounds) for m in self.moves)
        return pools, moves, tuple(self.mv)
