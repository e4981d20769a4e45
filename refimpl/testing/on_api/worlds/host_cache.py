"""The shared host cache on the API (``Config.host_cache``): a mixin of ``ApiSubject``.

The cache is a ``DiskTier`` (in a temp folder, on tmpfs where there is one) holding the
prompt's one chunk (``chunk_tokens`` = the prompt: the spec's one key); its I/O threads
are stepped with ``refimpl.tiers.transfer.Stepper`` (the shipped ``Transfer``'s stop
checks: before each block read, before the file written, before the renames):

    HostLookup       ``tier.open_prefix``: the hit, open and pinned (a miss: refused,
                     PublishAfterCommit)
    HostLoadBegin    ``reload_async(prefix=the lookup's, stepper=)``: the device blocks
                     RESERVED, the I/O thread waits before block 0
    HostLoadCopy     the thread reads and verifies one block (``Stepper.step``); a block
                     that fails its checksum ends the thread, the load's ``Prefix.bad``
                     set (the spec's HK_READ_BAD: the load's fact, not the copy's)
    HostLoadCommit   ``Transfer.poll``: committed (a load still reading, or one whose
                     read failed: NoPartialUse)
    HostLoadFail     a load whose read failed: ``poll``, a ``MissError``, the blocks
                     given back, the chunk unpublished (a cancel of it, at the request's
                     quiesce, unpublishes it too); a load whose reads found nothing
                     bad yet: the thread steps to its next read (which fails), then poll
    HostStoreBegin   ``offload_async(stepper=)``: the blocks pinned, the temp file written
                     (the eager ``HostStoreCopy``), the thread waits before the renames
    HostPublish      the thread renames, ``poll``: the pin dropped
    HostStoreAbort   ``Transfer.cancel``: the temp file removed, nothing published; the
                     cancel waits for the writer (the eager ``HostLateComplete``)
    HostEvict        ``tier.remove``: lookups miss at once; the file goes at its last
                     reader (the eager ``HostFree``)
    EnvLoadFail      the copy's blocks damaged in place on disk (one byte of each
                     flipped: every read of the copy fails its checksum, the spec's
                     hc_bad; the header still checks, so lookups still hit)

The refinement map (``refimpl.api.abstract.host_cache_part``) reads the tier (a lookup,
the pins, the temp files, the bytes against their checksums) and the engine's handles.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any

from refimpl.api.abstract import host_cache_part
from refimpl.api.disk import DiskTier, Miss, Prefix
from refimpl.api.offload import offload, offload_async, reload_async
from refimpl.engine.data import RankPools
from refimpl.errors import MissError, OwnershipError
from refimpl.tiers.transfer import Stepper, Transfer
from spec.behaviours.host_cache import HK_HIT, HK_LOAD, HK_READ_BAD, HK_STORE
from spec.config import Config
from spec.state import COMPLETE, FILLING, PREEMPTED, PREFILLING, QUEUED, RUNNING

__all__ = ["HostCacheActions"]

_WAITING = (QUEUED, PREEMPTED)


def _cleanup(folder: str, steppers: list[Stepper]) -> None:
    for s in steppers:  # a walk that ended mid-transfer: let its threads end
        s.release()
    shutil.rmtree(folder, ignore_errors=True)


class HostCacheActions:
    """The host-cache actions and registers; the rest is ``ApiActions``'s."""

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
    token_ids: Any
    model: Any
    tier_mutants: frozenset[str]

    def host_cache_init(self, n: int) -> None:
        self.tier: DiskTier | None = None
        self.look: list[Prefix | None] = [None] * n  # a lookup's hit, pinned
        self.loads: list[tuple[Transfer[Any, Any], Stepper, Prefix] | None] = [None] * n
        self.store: tuple[int, Transfer[Any, Any], Stepper] | None = None
        self.steppers: list[Stepper] = []
        if not self.c.host_cache:
            return
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.folder = tempfile.mkdtemp(prefix="kvown-hc-", dir=shm)
        weakref.finalize(self, _cleanup, self.folder, self.steppers)
        tokens = self.token_ids()
        self.tier = DiskTier(
            self.folder, self.model_id, chunk_tokens=len(tokens), mutants=self.tier_mutants
        )
        self.key = self.tier.key(self.gp, tokens)
        if self.c.host_cache == 2:  # warm: the prompt's copy published at the start
            dev = self.gp.make_rank_pools(0, self.c.blocks)
            dev.write_full("warm", dev.alloc.allocate("warm", self.c.blocks), self.content())
            offload(dev, self.gp, self.tier, None, "warm", tokens, free_device=True)

    def content(self) -> Any:
        return self.model.content(0, 0)  # a shared prompt: every request's prompt KV

    # ------------------------------------------------------------ the map
    def cache_world(self) -> dict[str, Any]:
        if self.tier is None:
            return {}
        readers = [p for p in self.look if p is not None]
        readers += [m[2] for m in self.loads if m is not None]
        storing = self.store is not None
        return host_cache_part(self.tier, self.gp, self.token_ids(), readers, storing)

    def cache_fields(self, i: int) -> dict[str, int]:
        """hk, gl and (a load or a store in progress) p of request i."""
        if self.tier is None:
            return {}
        if self.look[i] is not None:
            return {"hk": HK_HIT}
        if (m := self.loads[i]) is not None:
            hk = HK_READ_BAD if m[2].bad is not None else HK_LOAD  # its read failed
            return {"hk": hk, "gl": m[1].passed, "p": FILLING}
        if self.store is not None and self.store[0] == i:
            return {"hk": HK_STORE, "p": COMPLETE, "mv": self.mv[i]}  # read-only: pinned
        return {"mv": self.mv[i]} if self.c.host_cache else {}

    def cache_hit(self, i: int) -> bool:
        """The scheduler looks the prompt up first: a hit (or a lookup held) is loaded."""
        if self.tier is None:
            return False
        busy = self.look[i] is not None or self.loads[i] is not None
        return busy or self.tier.lookup(self.gp, self.token_ids()) > 0

    def cache_free(self, i: int) -> bool:
        """No lookup, load or store of request i in progress."""
        busy = self.look[i] or self.loads[i] or (self.store and self.store[0] == i)
        return not busy

    def host_free(self, i: int) -> bool:
        return self.cache_free(i) and super().host_free(i)  # type: ignore[misc]

    def tier_busy(self, i: int) -> None:
        """The scheduler does not step a request whose store reads its blocks (they are
        pinned: the allocator would refuse the write, FrozenSnapshot; the spec's step is
        not enabled)."""
        self._need(self.store is None or self.store[0] != i, "a store reads its blocks")
        super().tier_busy(i)  # type: ignore[misc]

    def quiesce_tier(self, i: int) -> None:
        self.quiesce_cache(i)
        super().quiesce_tier(i)  # type: ignore[misc]

    def tier_fields(self, i: int) -> dict[str, int]:
        return {**super().tier_fields(i), **self.cache_fields(i)}  # type: ignore[misc]

    def quiesce_cache(self, i: int) -> None:
        """An ended request lets go: its lookup closed, its load cancelled (a finished
        one's result stands: its blocks are then freed with the rest; one whose read
        failed unpublishes the bad chunk as it settles); a store it feeds must end
        first."""
        if self.store is not None and self.store[0] == i:
            raise OwnershipError(f"{self.rid(i)}: a store reads its blocks", prop="NoReuseUnderIO")
        if (p := self.look[i]) is not None:
            p.close()
            self.look[i] = None
        if (m := self.loads[i]) is not None:
            m[0].cancel()
            self.loads[i] = None

    # ------------------------------------------------------------ actions
    def _cache(self) -> DiskTier:
        self._need(self.tier is not None and self.p_up, "no host cache")
        assert self.tier is not None
        return self.tier

    def _HostLookup(self, i: int, arg: int) -> None:
        tier = self._cache()
        self._need(self.st[i] in _WAITING and self.cache_free(i), "not waiting")
        self._need(not self.pp[0].alloc.blocks_of(self.rid(i)), "holds blocks")
        got = tier.open_prefix(self.gp, self.token_ids())
        if isinstance(got, Miss):
            raise MissError(f"{self.rid(i)}: a miss ({got.reason})", prop="PublishAfterCommit")
        self.look[i] = got

    def _HostLoadBegin(self, i: int, arg: int) -> None:
        tier = self._cache()
        p = self.look[i]
        self._need(p is not None and self.st[i] in _WAITING, "no hit to load")
        s = Stepper()
        t = reload_async(
            tier, self.pp[0], self.gp, self.rid(i), self.token_ids(),
            free_host=False, prefix=p, stepper=s,
        )  # fmt: skip
        self.steppers.append(s)
        s.settle()  # the thread waits before block 0
        self.look[i], self.loads[i] = None, (t, s, p)  # type: ignore[assignment]

    def _load(self, i: int) -> tuple[Transfer[Any, Any], Stepper, Prefix]:
        self._cache()
        m = self.loads[i]
        self._need(m is not None, "no load in progress")
        assert m is not None
        return m

    def _HostLoadCopy(self, i: int, arg: int) -> None:
        self._need(self._load(i)[1].step(), "every block read")

    def _HostLoadCommit(self, i: int, arg: int) -> None:
        t, s, p = self._load(i)
        self._need(self.st[i] in _WAITING, "an ended request's load is not used")
        if p.bad is not None:  # asked before poll, which would settle it (HostLoadFail)
            raise OwnershipError(f"{self.rid(i)}: its load read bad bytes", prop="NoPartialUse")
        if s.parked or not t.poll():
            raise OwnershipError(f"{self.rid(i)}: its load is still reading", prop="NoPartialUse")
        self.loads[i] = None
        try:
            t.wait()
        except MissError:
            return  # failed: the request still waits (the map shows it; the spec commits)
        self.st[i] = PREFILLING

    def _HostLoadFail(self, i: int, arg: int) -> None:
        t, s, p = self._load(i)
        if p.bad is None:  # one step: the I/O thread reads the next block, which fails
            self._need(s.parked, "every block read, none found bad")
            s.step()
            if p.bad is None:
                raise AssertionError(f"{self.rid(i)}: its next read found no bad bytes")
        self._need(t.poll(), "the load has not ended")
        self.loads[i] = None
        try:
            t.wait()
        except MissError:
            return
        raise AssertionError(f"{self.rid(i)}: a load whose read failed was committed")

    def _HostStoreBegin(self, i: int, arg: int) -> None:
        tier = self._cache()
        rid = self.rid(i)
        self._need(self.st[i] == RUNNING and self.cache_free(i), "not running")
        self._need(bool(self.pp[0].alloc.blocks_of(rid)), "no device copy")
        self._need(self.store is None and self.mv[i] < self.c.max_moves, "a store or no move")
        tokens = self.token_ids()
        self._need(tier.lookup(self.gp, tokens) == 0, "the key is held")
        self._need(tier.pinned(self.key) == 0, "the key's old copy is still read")
        s = Stepper()
        t = offload_async(self.pp[0], self.gp, tier, rid, tokens, epoch=self.mv[i] + 1, stepper=s)
        self.steppers.append(s)
        s.step()  # the temp file written: the thread waits before the renames
        self.store = (i, t, s)
        self.mv[i] += 1

    def _store(self, i: int) -> tuple[Transfer[Any, Any], Stepper]:
        self._cache()
        self._need(self.store is not None and self.store[0] == i, "no store in flight")
        assert self.store is not None
        return self.store[1], self.store[2]

    def _HostPublish(self, i: int, arg: int) -> None:
        t, s = self._store(i)
        s.step()  # the renames
        self._need(t.poll(), "the store has not ended")
        self.store = None
        t.wait()  # the published copy, or its error raised (a divergence)

    def _HostStoreAbort(self, i: int, arg: int) -> None:
        t, _ = self._store(i)
        t.cancel()
        self.store = None

    def _HostEvict(self, i: int, arg: int) -> None:
        tier = self._cache()
        self._need(tier.lookup(self.gp, self.token_ids()) > 0, "nothing published")
        tier.remove(self.key)

    def _EnvLoadFail(self, i: int, arg: int) -> None:
        tier = self._cache()
        ok = "load_fail" in self.c.fault_kinds and self.faults < self.c.faults
        self._need(ok and tier.path(self.key).exists(), "no fault left or no copy")
        damage_blocks(tier, self.key, self.c.blocks)
        self.faults += 1

    def cache_snapshot(self) -> object:
        if self.tier is None:
            return ()
        files = tuple(sorted(os.listdir(self.folder)))
        looks = tuple(p is not None for p in self.look)
        loads = tuple(None if m is None else (m[1].passed, m[1].parked) for m in self.loads)
        return files, looks, loads, self.store is not None, self.tier.pinned(self.key)

    @property
    def model_id(self) -> Any:
        from refimpl.testing.on_api.subject import MODEL

        return MODEL


def damage_blocks(tier: DiskTier, key: str, blocks: int) -> None:
    """Flip one byte of each of the ``blocks`` blocks of ``key``'s file, in place (its
    readers' open files see it): every read of the copy fails its checksum."""
    from refimpl.tiers.files import read_header

    with open(tier.path(key), "r+b") as f:
        h = read_header(f)
        e = h.entries["kv"]
        nbytes = (e.end - e.begin) // blocks
        for k in range(blocks):
            at = h.data_start + e.begin + (k + 1) * nbytes - 1  # the last byte of block k
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))
