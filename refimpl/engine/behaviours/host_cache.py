"""The shared host cache (spec ``spec/behaviours/host_cache.py``) on the engine's host pool.

One content key (every request of a host-cache world has the same prompt, so the same
prefix hash): its copy lives in host blocks held by ``host-cache#<attempt>``, RESERVED
while a store fills it and OWNED once written; ``published`` is the lookup index's
entry (unpublished: a lookup misses, the bytes stay until the pins drain). A lookup hit
records the copy's block ids (SGLang's ``host_indices``) and takes a pin (``hc_pin``,
the refcount the free checks); the load copies from those ids into GPU blocks the
request reserved, and does not consume the copy. A store writes under a name of its
own attempt, so a late completion of an abandoned attempt names blocks that are not the
key's: it is a no-op, and its bytes are freed. ``hc_bad`` is read from the bytes: the
copy's blocks no longer hash to the checksums taken when they were written.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.blocks import BlockStatus
from refimpl.engine.base import NotEnabled, UnpublishedError
from refimpl.engine.data import gen
from refimpl.engine.env import EnvActions
from refimpl.engine.inflight import step_guard
from refimpl.errors import CapacityError, IncompleteError, InUseError
from spec.behaviours.host_cache import HK_HIT, HK_LOAD, HK_LOADING, HK_READ_BAD, HK_STORE
from spec.state import (
    COMPLETE,
    ENDED,
    FILLING,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUARANTINED,
    QUEUED,
    RUNNING,
    WRITABLE,
)

__all__ = ["HostCacheActions"]

_WAITING = (QUEUED, PREEMPTED)


class HostCacheActions(EnvActions):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        n_reqs = self.config.n_reqs
        self.hk = [0] * n_reqs  # each request's role at the cache (spec Req.hk)
        self.hc_src: list[tuple[int, ...]] = [()] * n_reqs  # the hit's host block ids
        self.hc_from_cache = [False] * n_reqs  # the GPU copy was loaded, not computed
        self.hc_attempt, self.hc_holder, self.hc_published = 0, "", False
        self.hc_hl, self.hc_pin = 0, 0
        self.hc_late: list[str] = []  # holders of abandoned attempts, completion pending
        self.hc_sums: list[str] = []  # checksums of the copy's blocks, taken when written
        if self.config.host_cache == 2:  # warm: an earlier request left the key published
            blocks = self.H.alloc.allocate(self._hc_new_holder(), self.n)
            self.H.write_full(self.hc_holder, blocks, self._hc_content())
            self.hc_published, self.hc_hl = True, self.n
            self.hc_sums = [self.H.block_checksum(b) for b in blocks]

    # ------------------------------------------------------------ queries
    def _hc_new_holder(self) -> str:
        self.hc_attempt += 1
        self.hc_holder = f"host-cache#{self.hc_attempt}"
        return self.hc_holder

    def _hc_content(self) -> torch.Tensor:
        return torch.stack([self._block_kv(-1, j) for j in range(self.n)])

    def hc_blocks(self) -> tuple[int, ...]:
        return self.H.alloc.blocks_of(self.hc_holder) if self.hc_holder else ()

    def hc_status(self) -> int:
        blocks = self.hc_blocks()
        if not blocks:
            return NONE
        if self.H.alloc.status(blocks[0]) is BlockStatus.RESERVED:
            return FILLING
        return COMPLETE if self.hc_published else QUARANTINED

    def hc_bad(self) -> bool:
        blocks = self.hc_blocks()
        if not blocks or self.hc_status() == FILLING:
            return False
        return [self.H.block_checksum(b) for b in blocks] != self.hc_sums

    def _block_kv(self, i: int, j: int) -> torch.Tensor:
        """In a host-cache world every request has the same prompt: the key's content."""
        if self.config.host_cache:
            return gen(self.block_shape_full, self.dtype, self.seed, "prefix", j)
        return super()._block_kv(i, j)

    def _next_slot(self, i: int) -> tuple[int, int] | None:
        """The prompt's blocks are the shared key's: a generated token's KV is not written
        into them (as with a full prefix hit: the spec allocates no block for it)."""
        return None if self.config.host_cache else super()._next_slot(i)

    def _hc_ne(self, name: str, i: int) -> NotEnabled:
        return NotEnabled(f"{name}(req={i}) does not apply (host cache {self.hc_status()})")

    def _unpin(self, i: int) -> None:
        self.hk[i], self.hc_src[i] = 0, ()
        self.hc_pin -= 1

    # ------------------------------------------------------------ lookup and load
    def HostLookup(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.config.host_cache or not self.p_up or r.status not in _WAITING:
            raise self._hc_ne("HostLookup", i)
        if self.p_status(i) != NONE or self.hk[i]:
            raise self._hc_ne("HostLookup", i)
        if self.hc_status() != COMPLETE:
            raise UnpublishedError(f"r{i}: the key is not published (a miss)")
        self.hk[i], self.hc_src[i] = HK_HIT, self.hc_blocks()
        self.hc_pin += 1

    def HostLoadBegin(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or self.hk[i] != HK_HIT or r.status not in _WAITING:
            raise self._hc_ne("HostLoadBegin", i)
        if self.p_status(i) != NONE:
            raise self._hc_ne("HostLoadBegin", i)
        if not self.P.alloc.can_allocate(self.n):
            raise CapacityError(f"r{i} needs {self.n} GPU blocks, {self.P.alloc.num_free} free")
        self.P.alloc.reserve(self.rid(i), self.n, epoch=0)
        r.reloading, r.loaded, self.hk[i], r.window = True, 0, HK_LOAD, []  # a whole copy
        if "unpin_at_load_start" in self.m:
            self.hc_pin -= 1  # the bug: the pin goes when the load starts

    def HostLoadCopy(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or self.hk[i] != HK_LOAD or not r.reloading or r.loaded >= self.n:
            raise self._hc_ne("HostLoadCopy", i)
        j, dst = r.loaded, self.P.alloc.blocks_of(self.rid(i))
        self._copy(self.H, [self.hc_src[i][j]], self.P, [dst[j]], i)  # H2D of block j
        r.loaded += 1
        if self.hc_bad():  # the read checks the copy's bytes as they are now: it stops
            self.hk[i] = HK_READ_BAD

    def HostLoadCommit(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or self.hk[i] not in HK_LOADING or not r.reloading:
            raise self._hc_ne("HostLoadCommit", i)
        if r.status not in _WAITING:
            raise self._hc_ne("HostLoadCommit", i)
        if r.loaded != self.n or self.hk[i] == HK_READ_BAD:
            raise IncompleteError(f"r{i}: {r.loaded} of {self.n} blocks, read error: the load")
        self._hc_loaded(i)
        if "reload_consumes_shared" in self.m:  # the swap-in path frees the host copy
            self.release_all(self.H, self.hc_holder)
            self.hc_hl = 0

    def _hc_loaded(self, i: int) -> None:
        r = self.req[i]
        self.P.alloc.commit(self.rid(i), 0)
        r.reloading, r.loaded, r.status = False, 0, PREFILLING
        self.truth[i], self.hc_from_cache[i] = self._compute_kv(i), True
        self._unpin(i)

    def HostLoadFail(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or self.hk[i] not in HK_LOADING or not r.reloading:
            raise self._hc_ne("HostLoadFail", i)
        if self.hk[i] == HK_LOAD and (r.loaded >= self.n or not self.hc_bad()):
            raise self._hc_ne("HostLoadFail", i)  # else: this step reads the next block, bad
        if "failed_load_counted_loaded" in self.m:
            self._hc_loaded(i)  # the bug: reported loaded, the request runs on unread blocks
            return
        self.release_all(self.P, self.rid(i))  # the partly loaded blocks go back
        r.reloading, r.loaded = False, 0
        self._unpin(i)
        if self.hc_published and "failed_load_keeps_hit" not in self.m:
            self.hc_published = False  # the hit becomes a miss

    def PrefillRun(self, req: int) -> None:
        """A request whose KV was loaded from the cache has nothing left to compute."""
        i, r = req, self.req[req]
        if not self.hc_from_cache[i] or self.config.async_steps or not self.p_up:
            super().PrefillRun(req)
            return
        if r.status != PREFILLING or self.p_status(i) != WRITABLE:
            raise self._hc_ne("PrefillRun", i)
        r.status, r.computed, self.hc_from_cache[i] = RUNNING, True, False

    def PrefillAdmit(self, req: int) -> None:
        if self.hk[req] or (self.config.host_cache and self.hc_status() == COMPLETE):
            raise self._hc_ne("PrefillAdmit", req)  # a hit: the lookup loads it instead
        super().PrefillAdmit(req)

    # ------------------------------------------------------------ store and publish
    def HostStoreBegin(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.host_cache or not self.p_up or r.status != RUNNING or r.phase:
            raise self._hc_ne("HostStoreBegin", i)
        if self.p_status(i) != WRITABLE or self.hk[i] or self.h_status(i) != NONE:
            raise self._hc_ne("HostStoreBegin", i)
        if self.hc_status() != NONE or r.moves >= c.max_moves or r.window:  # a whole copy
            raise self._hc_ne("HostStoreBegin", i)
        if not self.H.alloc.can_allocate(self.n):
            raise CapacityError(f"r{i} needs {self.n} host blocks, {self.H.alloc.num_free} free")
        step_guard(self, i, "p", "freeze")  # a step in flight still writes the blocks
        rid = self.rid(i)
        self.P.alloc.incref(rid + "@store", self.P.alloc.blocks_of(rid))  # read-only now
        self.frozen_truth[i] = self.truth[i]
        self.H.alloc.reserve(self._hc_new_holder(), self.n, epoch=0)
        self.hk[i], self.hc_hl, self.hc_published, r.moves = HK_STORE, 0, False, r.moves + 1

    def HostStoreCopy(self, req: int) -> None:
        i = req
        if not self.p_up or self.hk[i] != HK_STORE or self.hc_status() != FILLING:
            raise self._hc_ne("HostStoreCopy", i)
        if self.hc_hl >= self.n:
            raise self._hc_ne("HostStoreCopy", i)
        j, src = self.hc_hl, self.p_table(i)
        self._copy(self.P, [src[j]], self.H, [self.hc_blocks()[j]], i, self.hc_holder)
        self.hc_hl += 1

    def HostPublish(self, req: int) -> None:
        i = req
        if not self.p_up or self.hk[i] != HK_STORE or self.hc_status() != FILLING:
            raise self._hc_ne("HostPublish", i)
        if self.hc_hl != self.n and "publish_before_commit" not in self.m:
            raise UnpublishedError(f"r{i}: {self.hc_hl} of {self.n} blocks in the host copy")
        self._hc_publish()
        self.P.alloc.free(self.rid(i) + "@store")  # the source thaws
        self.hk[i] = 0

    def _hc_publish(self) -> None:
        self.H.alloc.commit(self.hc_holder, 0)
        self.hc_published = True
        self.hc_sums = [self.H.block_checksum(b) for b in self.hc_blocks()]

    def HostStoreAbort(self, req: int) -> None:
        i = req
        if not self.p_up or self.hk[i] != HK_STORE or self.hc_status() != FILLING:
            raise self._hc_ne("HostStoreAbort", i)
        self.hc_late.append(self.hc_holder)  # its writer's completion is still to come
        self.hc_holder, self.hc_hl = "", 0
        self.P.alloc.free(self.rid(i) + "@store")
        self.hk[i] = 0

    def HostLateComplete(self) -> None:
        if not self.p_up or not self.hc_late:
            raise NotEnabled("HostLateComplete: no completion of an abandoned store pending")
        late = self.hc_late.pop(0)
        if "late_completion_publishes" not in self.m:
            self.release_all(self.H, late)  # not the key's attempt: a no-op, bytes freed
            return
        if self.hc_holder:  # a stale PutEnd marks the current attempt's copy complete
            self.release_all(self.H, late)
        else:
            self.hc_holder = late  # or adopts its own bytes as the key's
        self._hc_publish()

    # ------------------------------------------------------------ delete in two phases
    def HostEvict(self) -> None:
        if not self.config.host_cache or not self.p_up or self.hc_status() != COMPLETE:
            raise NotEnabled("HostEvict: no published host copy")
        self.hc_published = False

    def HostFree(self) -> None:
        if not self.config.host_cache or not self.p_up:
            raise NotEnabled("HostFree: no host cache")
        hc = self.hc_status()
        if hc not in (COMPLETE, QUARANTINED):
            raise NotEnabled("HostFree: no host copy")
        if self.hc_pin and "evict_pinned_copy" not in self.m:
            raise InUseError(f"the host copy has {self.hc_pin} pins (a hit or a load reads it)")
        if hc == COMPLETE:
            raise NotEnabled("HostFree: the copy is published; unpublish it first (HostEvict)")
        self.release_all(self.H, self.hc_holder)
        self.hc_holder, self.hc_hl, self.hc_sums = "", 0, []

    def EnvLoadFail(self) -> None:
        c = self.config
        if "load_fail" not in c.fault_kinds or self.faults >= c.faults:
            raise NotEnabled("EnvLoadFail: no 'load_fail' fault left")
        if self.hc_status() not in (COMPLETE, QUARANTINED) or self.hc_bad():
            raise NotEnabled("EnvLoadFail: no readable host copy")
        last = self.hc_blocks()[-1:]  # a read error: the last block's bytes are lost
        self.H.write_full_raw(last, torch.full_like(self._hc_content()[-1:], 7.0))
        self.faults += 1

    # ------------------------------------------------------------ the core's actions
    def PrefillQuiesce(self, req: int) -> None:
        """An ended request lets go of the cache: its pin goes; a store it feeds must end."""
        i, r = req, self.req[req]
        if not self.hk[i] or not self.p_up or r.status not in ENDED:
            super().PrefillQuiesce(req)
            return
        if self.hk[i] == HK_STORE:
            raise InUseError(f"a store of r{i}'s blocks to the host cache is in flight")
        if self.hk[i] == HK_READ_BAD:  # its load found the copy bad: unpublished, as a fail
            self.hc_published = False
        self._unpin(i)
        if self.p_status(i) != NONE or self.h_status(i) != NONE or r.phase:
            super().PrefillQuiesce(req)

    def _crash_prefill(self) -> None:
        super()._crash_prefill()  # the host pool is gone with the worker
        self.hk = [0] * self.config.n_reqs
        self.hc_src = [()] * self.config.n_reqs
        self.hc_holder, self.hc_published, self.hc_hl, self.hc_pin = "", False, 0, 0
        self.hc_late, self.hc_sums = [], []
