"""Offload and reload to a ``DiskTier`` on the API (``ApiAdapter(offload_to="disk")``): a
mixin of ``ApiSubject`` over ``OffloadActions`` (which runs the same worlds on host pools).

The host tier is a ``DiskTier`` in a temp folder (on tmpfs where there is one); request
i's prompt is its own (``disk_tokens``: the spec's h is one copy per request, so two
requests never share a content key), stored as one chunk file. Each move is the shipped
``offload_async``/``reload_async`` ``Transfer``, its I/O thread stepped through its stop
checks (``refimpl.tiers.transfer.Stepper``):

    PrefillOffloadBegin   ``offload_async(free_device=True)``: the device blocks pinned,
                          one step: the temp file written (the eager
                          ``PrefillOffloadCopy`` of every block); the thread waits at the
                          stop check before the renames
    PrefillOffloadCommit  one step: the rename (the publish), then ``poll``: the pin
                          dropped, the device blocks freed
    EnvStoreFail          ``Transfer.cancel`` while the thread waits before the renames:
                          the temp file removed, nothing published, the device copy
                          thawed (the harness reads the folder, not cancel's answer)
    PrefillReloadBegin    ``reload_async(free_host=True)``: the device blocks RESERVED,
                          every block read and verified (the eager ``PrefillReloadCopy``)
    PrefillReloadCommit   ``poll``: committed on the device, the file unpublished
    PrefillQuiesce        (an ended request) its move cancelled (a reload that read
                          every block: its result stands), its copy removed
    EnvCrash (prefill)    the process is gone: its I/O threads never run again (a store's
                          waits forever before its renames, its temp file an orphan), the
                          tier's object with it; the files stay on disk
    EnvRestart (prefill)  a new ``DiskTier`` over the same folder: it adopts every
                          published file (``DiskTier.adopted``)

The refinement map reads the folder: request i's h is COMPLETE while its key is published
by this incarnation's tier (a file the restarted tier adopted is the cache's, no
request's: the spec's h is a request's copy, and the crash ended the request and the
engine's record of it); an offload in flight is FILLING with every block copied once
its temp file is written; a reload's gl is the blocks its thread read, its p FILLING
while the device blocks are RESERVED. The survival check (``disk_problems``): every copy
published when the prefill crashed is adopted by the restarted tier, and reads back whole
(every block against its checksum) as the request's KV.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any

import torch

from refimpl.api.disk import DiskTier
from refimpl.api.offload import offload_async, reload_async
from refimpl.blocks import BlockStatus
from refimpl.engine.data import RankPools
from refimpl.errors import CapacityError, OwnershipError
from refimpl.testing.on_api.worlds.offload import OffloadActions
from refimpl.tiers.files import TEMP_SUFFIX
from refimpl.tiers.transfer import Stepper, Transfer
from spec.config import Config
from spec.state import COMPLETE, FILLING, NONE

__all__ = ["DiskOffloadActions", "disk_tokens"]


def disk_tokens(i: int, n_tokens: int) -> list[int]:
    """Request i's prompt for the disk tier: its own token ids (its own content key)."""
    return [1000 * (i + 1) + t for t in range(n_tokens)]


def _cleanup(folder: str, steppers: list[Stepper]) -> None:
    for s in steppers:  # a walk that ended mid-transfer (or a crash's): let its threads end
        s.release()
    shutil.rmtree(folder, ignore_errors=True)


Move = tuple[str, Transfer[Any, Any], Stepper]


class DiskOffloadActions(OffloadActions):
    """The offload actions on a ``DiskTier`` where ``self.disk``, else host pools'."""

    c: Config
    n: int
    pp: list[RankPools]
    gp: Any
    st: list[int]
    mv: list[int]
    faults: int
    p_up: bool
    rid: Any
    _need: Any
    model: Any
    tier_mutants: frozenset[str]
    disk: bool

    def disk_init(self) -> None:
        """The tier (none where the world has no offload or the host is pools)."""
        self.dtier: DiskTier | None = None
        self.dmoves: list[Move | None] = [None] * self.n
        self.survivors: dict[int, str] = {}  # request -> key, published at the crash
        if not (self.c.offload and self.disk):
            return
        self.hp = []  # no host pools: the tier is the folder
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dfolder = tempfile.mkdtemp(prefix="kvown-off-", dir=shm)
        self.dsteppers: list[Stepper] = []
        weakref.finalize(self, _cleanup, self.dfolder, self.dsteppers)
        self.dtier = self.new_tier()
        self.dkeys = [self.dtier.key(self.gp, self.dtokens(i)) for i in range(self.n)]

    def new_tier(self) -> DiskTier:
        """A ``DiskTier`` over the folder: construction is a restart (orphans swept,
        published files adopted)."""
        from refimpl.testing.on_api.subject import MODEL

        return DiskTier(
            self.dfolder, MODEL, chunk_tokens=len(self.dtokens(0)), mutants=self.tier_mutants
        )

    def dtokens(self, i: int) -> list[int]:
        return disk_tokens(i, self.c.blocks * self.gp.block_size)

    # ------------------------------------------------------------ the map
    def published(self, i: int) -> bool:
        """Request i's copy is published by this incarnation's tier (not adopted)."""
        t, key = self.dtier, self.dkeys[i] if self.disk else ""
        return t is not None and self.p_up and key not in t.adopted and t.path(key).is_file()

    def _temp(self, i: int) -> bool:
        pre = f".{self.dkeys[i]}."
        return any(n.startswith(pre) and n.endswith(TEMP_SUFFIX) for n in os.listdir(self.dfolder))

    def tier_fields(self, i: int) -> dict[str, int]:
        if not self.disk or not self.c.offload:
            return super().tier_fields(i)
        b, mine = self.c.blocks, self.published(i)
        out = {"h": COMPLETE if mine else NONE, "hl": b if mine else 0, "gl": 0, "mv": self.mv[i]}
        if (m := self.dmoves[i]) is None:
            return out
        kind, _, s = m
        rid = self.rid(i)
        held = self.pp[0].alloc.blocks_of(rid)
        if kind == "offload":
            if not mine:  # a visible copy is COMPLETE whatever the move says
                out.update(h=FILLING, hl=b if self._temp(i) else 0)
            out["p"] = COMPLETE if held else NONE
        else:
            reserved = bool(held) and self.pp[0].alloc.status(held[0]) is BlockStatus.RESERVED
            out.update(gl=min(s.passed, b), p=FILLING if reserved else NONE)
        return out

    def move_of(self, i: int, kind: str) -> Any:
        if not self.disk:
            return super().move_of(i, kind)
        m = self.dmoves[i]
        return m if m is not None and m[0] == kind else None

    def pinned_by_move(self, i: int) -> tuple[int, ...]:
        """The device blocks an offload's pin holds (the allocator's holders)."""
        if not self.disk:
            return super().pinned_by_move(i)  # type: ignore[misc,no-any-return]
        pre = f"{self.rid(i)}@offload"
        a = self.pp[0].alloc
        return tuple(b for h in a.holders() if h.startswith(pre) for b in a.blocks_of(h))

    def _PrefillPreempt(self, i: int, arg: int) -> None:
        """As ``RecomputeActions``'s; a reload's RESERVED blocks are not the request's."""
        self._need(not self.disk or self.move_of(i, "reload") is None, "a move holds it")
        super()._PrefillPreempt(i, arg)  # type: ignore[misc]

    def tier_busy(self, i: int) -> None:
        if not self.disk:
            return super().tier_busy(i)
        if self.move_of(i, "offload") is not None:
            raise OwnershipError(
                f"{self.rid(i)}: an offload reads its blocks", prop="FrozenSnapshot"
            )
        self._need(self.move_of(i, "reload") is None, "a reload is in progress")
        return None

    def host_free(self, i: int) -> bool:
        if not self.disk:
            return super().host_free(i)
        return self.dmoves[i] is None and not self.published(i)

    def host_replica(self, i: int) -> torch.Tensor | None:
        if not self.disk:
            return super().host_replica(i)
        return self.read_back(i) if self.published(i) else None

    def read_back(self, i: int) -> torch.Tensor | None:
        """Request i's copy as the tier reads it (every block verified), or None."""
        assert self.dtier is not None
        got = self.dtier.load(self.gp, self.dtokens(i), "ghost-read")
        if not hasattr(got, "pools"):
            return None
        return got.pools.gather(got.blocks)  # type: ignore[union-attr]

    def host_used(self, but: int) -> int:
        return sum(self.c.blocks for k in range(self.n) if k != but and self.tier_fields(k)["h"])

    # ------------------------------------------------------------ actions
    def _PrefillOffloadBegin(self, i: int, arg: int) -> None:
        if not self.disk:
            return super()._PrefillOffloadBegin(i, arg)
        rid = self._offload_ready(i)
        if (used := self.host_used(i)) + self.c.blocks > self.c.cap_h:
            raise CapacityError(f"{rid}: {used} of {self.c.cap_h} host blocks used")
        assert self.dtier is not None
        s = Stepper()
        t = offload_async(
            self.pp[0], self.gp, self.dtier, rid, self.dtokens(i),
            free_device=True, epoch=self.mv[i] + 1, stepper=s,
        )  # fmt: skip
        self.dsteppers.append(s)
        s.step()  # the temp file written: the thread waits before the renames
        self.dmoves[i] = ("offload", t, s)
        self.mv[i] += 1
        return None

    def _commit(self, i: int, kind: str) -> None:
        if not self.disk:
            return super()._commit(i, kind)
        self._running(i)
        m = self.move_of(i, kind)
        self._need(m is not None, f"no {kind} in progress")
        _, t, s = m
        s.step()  # an offload's renames (a reload's thread has ended: nothing to let through)
        self._need(t.poll(), f"the {kind} has not ended")
        self.dmoves[i] = None
        t.wait()  # the committed move, or its error raised (a divergence)
        return None

    def _PrefillReloadBegin(self, i: int, arg: int) -> None:
        if not self.disk:
            return super()._PrefillReloadBegin(i, arg)
        self._running(i)
        rid = self.rid(i)
        if self.move_of(i, "offload") is not None:
            raise OwnershipError(f"{rid}: its store is in flight", prop="LoadXorStore")
        self._need(self.dmoves[i] is None and self.published(i), "no host copy")
        self._need(not self.pp[0].alloc.blocks_of(rid), "a device copy exists")
        if self.pp[0].alloc.num_free < self.c.blocks:
            raise CapacityError(f"{rid}: {self.pp[0].alloc.num_free} device blocks free")
        assert self.dtier is not None
        s = Stepper()
        t = reload_async(
            self.dtier, self.pp[0], self.gp, rid, self.dtokens(i),
            free_host=True, epoch=self.mv[i] + 1, stepper=s,
        )  # fmt: skip
        self.dsteppers.append(s)
        while s.step():  # every block read and verified (the eager PrefillReloadCopy)
            pass
        self.dmoves[i] = ("reload", t, s)
        return None

    def _EnvStoreFail(self, i: int, arg: int) -> None:
        if not self.disk:
            return super()._EnvStoreFail(i, arg)
        ok = "store_fail" in self.c.fault_kinds and self.faults < self.c.faults
        self._need(ok and self.p_up, "no fault left")
        m = self.move_of(i, "offload")
        self._need(m is not None, "no store in flight")
        m[1].cancel()  # what it stopped is read from the folder and the pools
        self.dmoves[i] = None
        self.faults += 1
        return None

    def quiesce_tier(self, i: int) -> None:
        if not self.disk:
            return super().quiesce_tier(i)
        if (m := self.dmoves[i]) is not None:
            m[1].cancel()  # a reload that read every block: committed, freed with the rest
        self.dmoves[i] = None
        if self.published(i):
            assert self.dtier is not None
            self.dtier.remove(self.dkeys[i])
        return None

    def crash_tier(self) -> None:
        if not self.disk:
            return super().crash_tier()
        self.survivors = {i: self.dkeys[i] for i in range(self.n) if self.dtier_has(i)}
        for m in self.dmoves:
            if m is not None:  # the dead process's thread never runs again; at the walk's
                m[1]._stop.set()  # noqa: SLF001 - end (cleanup) it unwinds, publishing nothing
        self.dmoves = [None] * self.n
        self.dtier = None
        return None

    def dtier_has(self, i: int) -> bool:
        t = self.dtier
        return t is not None and self.dkeys[i] not in t.adopted and t.path(self.dkeys[i]).is_file()

    def restart_tier(self) -> None:
        if self.disk and self.c.offload:
            self.dtier = self.new_tier()

    def disk_problems(self) -> list[str]:
        """A copy published when the prefill crashed survives it: the restarted tier
        adopts it and reads it back whole, the request's KV as stored."""
        if not self.survivors or self.dtier is None:
            return []
        out = []
        for i, key in self.survivors.items():
            want = self.model.content(i, self.model.stored[i])
            got = self.read_back(i) if key in self.dtier.adopted else None
            if got is None or not torch.equal(got, want):
                out.append(f"r{i}@disk: its copy did not survive the crash whole")
        return out

    def tier_snapshot(self) -> object:
        if not self.disk:
            return super().tier_snapshot()
        files = tuple(sorted(os.listdir(self.dfolder))) if self.c.offload else ()
        moves = tuple(None if m is None else (m[0], m[2].passed, m[1].done()) for m in self.dmoves)
        return files, moves, tuple(self.mv), self.dtier is not None

    def host_held(self) -> int:
        if not self.disk:
            return sum(p.alloc.capacity - p.alloc.num_free for p in self.hp)
        return self.host_used(-1)
