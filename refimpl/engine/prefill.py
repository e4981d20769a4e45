"""The scheduler / prefill worker's actions (spec ``actions_prefill``), on real tensors.

Each method checks every guard on the engine's own state first and raises a typed
``OwnershipError`` (``NotEnabled`` when the action does not apply); only then does it
change anything. The names are the spec's; so is the order of the guards, so a refusal
names the same property the spec's refusal names.
"""

from __future__ import annotations

from refimpl.checksum import bytes_checksum
from refimpl.chunks import Snapshot, build_manifest, manifest_checksums, pin_name
from refimpl.engine.base import (
    LoadStoreError,
    NotEnabled,
    ReqState,
    UnpublishedError,
)
from refimpl.engine.copies import CopyBase
from refimpl.engine.inflight import step_guard
from refimpl.engine.transfer_rules import writes_drained
from refimpl.errors import CapacityError, FrozenError, IncompleteError, InUseError, StaleError
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    ENDED,
    FAILED,
    FILLING,
    FINISHED,
    G_END_FAILED,
    G_FROZEN_WRITE,
    IDLE,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUEUED,
    RUNNING,
    SENDING,
    WRITABLE,
)


class PrefillActions(CopyBase):
    # ------------------------------------------------------------ helpers
    def _ne(self, name: str, i: int) -> NotEnabled:
        return NotEnabled(f"{name}(req={i}) does not apply in {self.describe(i)}")

    def _drop_prefill(self, i: int) -> None:
        """Free everything the prefill worker holds for request i (local copies stop first)."""
        rid, r = self.rid(i), self.req[i]
        a = self.P.alloc
        for holder in (pin_name(rid, r.epoch), rid + "@store"):
            a.free(holder)
        self.release_all(self.P, rid)
        self.release_all(self.H, rid)
        r.reloading = False
        r.payloads, r.checksums = [], []

    # ------------------------------------------------------------ admission and prefill
    def PrefillAdmit(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or r.status not in (QUEUED, PREEMPTED):
            raise self._ne("PrefillAdmit", i)
        if self.p_status(i) != NONE or self.h_status(i) != NONE:
            raise self._ne("PrefillAdmit", i)
        if not self.P.alloc.can_allocate(self.n):
            raise CapacityError(f"r{i} needs {self.n} prefill blocks, {self.P.alloc.num_free} free")
        self.P.alloc.allocate(self.rid(i), self.n)
        r.status, r.computed, r.window = PREFILLING, False, []  # a whole copy

    def PrefillRun(self, req: int) -> None:
        i, r = req, self.req[req]
        if self.config.async_steps or not self.p_up or r.status != PREFILLING:
            raise self._ne("PrefillRun", i)
        if self.p_status(i) != WRITABLE:
            raise self._ne("PrefillRun", i)
        kv = self._compute_kv(i)  # [n, layers, 2, H, bs, D]
        self.P.write_full(self.rid(i), self.P.alloc.blocks_of(self.rid(i)), kv)
        self.truth[i] = kv
        r.status, r.computed = RUNNING, True

    def PrefillDecodeStep(self, req: int) -> None:
        i, r = req, self.req[req]
        if self.config.async_steps or not self.p_up or r.status != RUNNING:
            raise self._ne("PrefillDecodeStep", i)
        p = self.p_status(i)
        blocks = self.p_table(i)
        if p == WRITABLE and r.phase == IDLE:
            self._append_token(i, self.P, blocks, self.rid(i))
            return
        if p == COMPLETE and (r.phase != IDLE or self.h_status(i) == FILLING):
            if "source_writes_while_frozen" not in self.m:
                raise FrozenError(f"r{i}'s blocks {list(blocks)} are a frozen snapshot")
            self._append_token(i, self.P, blocks, self.rid(i))  # the guard is switched off
            r.ghost |= G_FROZEN_WRITE
            return
        raise self._ne("PrefillDecodeStep", i)

    def PrefillFinish(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or r.status != RUNNING or self.p_status(i) != WRITABLE:
            raise self._ne("PrefillFinish", i)
        if r.phase != IDLE or self.h_status(i) != NONE:
            raise self._ne("PrefillFinish", i)
        step_guard(self, i, "p", "free")
        self.P.alloc.free(self.rid(i))
        r.status = FINISHED

    def PrefillPreempt(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.recompute or not self.p_up or r.status != RUNNING or r.phase != IDLE:
            raise self._ne("PrefillPreempt", i)
        if r.moves >= c.max_moves:
            raise self._ne("PrefillPreempt", i)
        p, h = self.p_status(i), self.h_status(i)
        if p == WRITABLE and h == NONE:
            step_guard(self, i, "p", "preempt")
            self.P.alloc.free(self.rid(i))
        elif p == COMPLETE and h == FILLING:
            if "preempt_during_store" not in self.m:
                raise InUseError(f"an offload of r{i} still reads its GPU blocks")
            self.P.alloc.free(self.rid(i) + "@store")  # the bug: drops the store's pin
            self.P.alloc.free(self.rid(i))
        else:
            raise self._ne("PrefillPreempt", i)
        r.status, r.moves = PREEMPTED, r.moves + 1

    # ------------------------------------------------------------ offload / reload
    def PrefillOffloadBegin(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.offload or not self.p_up or r.status != RUNNING:
            raise self._ne("PrefillOffloadBegin", i)
        if self.p_status(i) != WRITABLE or r.phase != IDLE:
            raise self._ne("PrefillOffloadBegin", i)
        if self.h_status(i) != NONE or r.moves >= c.max_moves or r.window:  # moves whole copies
            raise self._ne("PrefillOffloadBegin", i)
        if not self.H.alloc.can_allocate(self.n):
            raise CapacityError(f"r{i} needs {self.n} host blocks, {self.H.alloc.num_free} free")
        step_guard(self, i, "p", "freeze")
        rid = self.rid(i)
        self.P.alloc.incref(rid + "@store", self.P.alloc.blocks_of(rid))  # read-only now
        self.frozen_truth[i] = self.truth[i]  # shared until the next write
        self.H.alloc.reserve(rid, self.n, epoch=0)
        r.stored, r.moves = 0, r.moves + 1

    def PrefillOffloadCopy(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or r.status != RUNNING or self.h_status(i) != FILLING:
            raise self._ne("PrefillOffloadCopy", i)
        if self.p_status(i) != COMPLETE or r.stored >= self.n:
            raise self._ne("PrefillOffloadCopy", i)
        rid, j = self.rid(i), r.stored
        src, dst = self.p_table(i), self.H.alloc.blocks_of(rid)
        self._copy(self.P, [src[j]], self.H, [dst[j]], i)  # D2H of logical block j
        r.stored += 1

    def PrefillOffloadCommit(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or r.status != RUNNING or self.h_status(i) != FILLING:
            raise self._ne("PrefillOffloadCommit", i)
        if self.p_status(i) != COMPLETE:
            raise self._ne("PrefillOffloadCommit", i)
        if r.stored != self.n:
            raise UnpublishedError(f"r{i}: {r.stored} of {self.n} blocks stored")
        rid = self.rid(i)
        self.H.alloc.commit(rid, 0)  # publish the host copy, then free the GPU blocks
        self.P.alloc.free(rid + "@store")
        self.P.alloc.free(rid)

    def PrefillReloadBegin(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.offload or not self.p_up or r.status != RUNNING:
            raise self._ne("PrefillReloadBegin", i)
        p, h = self.p_status(i), self.h_status(i)
        if h == FILLING and p == COMPLETE:
            if "reload_during_store" not in self.m:
                raise LoadStoreError(f"a store of r{i} is in flight")
            r.reloading, r.loaded = True, 0  # the bug: reloads over the blocks being stored
            return
        if h != COMPLETE or p != NONE:
            raise self._ne("PrefillReloadBegin", i)
        if not self.P.alloc.can_allocate(self.n):
            raise CapacityError(f"r{i} needs {self.n} GPU blocks, {self.P.alloc.num_free} free")
        self.P.alloc.reserve(self.rid(i), self.n, epoch=0)
        r.reloading, r.loaded = True, 0

    def PrefillReloadCopy(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or r.status != RUNNING or self.p_status(i) != FILLING:
            raise self._ne("PrefillReloadCopy", i)
        if r.loaded >= self.n:
            raise self._ne("PrefillReloadCopy", i)
        rid, j = self.rid(i), r.loaded
        src, dst = self.H.alloc.blocks_of(rid), self.P.alloc.blocks_of(rid)
        self._copy(self.H, [src[j]], self.P, [dst[j]], i)  # H2D of logical block j
        r.loaded += 1

    def PrefillReloadCommit(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.p_up or r.status != RUNNING or self.p_status(i) != FILLING:
            raise self._ne("PrefillReloadCommit", i)
        if r.loaded != self.n:
            raise IncompleteError(f"r{i}: {r.loaded} of {self.n} blocks reloaded")
        rid = self.rid(i)
        host_done = self.h_status(i) == COMPLETE
        self.P.alloc.commit(rid, 0)
        r.reloading, r.loaded = False, 0
        if host_done:
            self.H.alloc.free(rid)
            r.stored = 0

    # ------------------------------------------------------------ handoff: sender
    def PrefillFreeze(self, req: int) -> None:
        i, r, c = req, self.req[req], self.config
        if not c.handoff or not self.p_up or r.status != RUNNING:
            raise self._ne("PrefillFreeze", i)
        if self.p_status(i) != WRITABLE or r.phase != IDLE:
            raise self._ne("PrefillFreeze", i)
        if self.h_status(i) != NONE or r.epoch >= c.max_attempts or r.window:  # a whole copy
            raise self._ne("PrefillFreeze", i)
        step_guard(self, i, "p", "freeze")
        rid, e = self.rid(i), self._next_epoch(r)
        blocks = self.P.alloc.blocks_of(rid)
        self.P.alloc.incref(pin_name(rid, e), blocks)  # the snapshot: read-only until released
        self.frozen_truth[i] = self.truth[i]  # shared until the next write
        r.payloads = [[self.P.shard_bytes(k, b) for b in blocks] for k in range(self.P.tp)]
        r.checksums = [[bytes_checksum(p) for p in rank] for rank in r.payloads]
        full = manifest_checksums(self.P, blocks, r.checksums[0])  # the API's convention
        snap = Snapshot(rid, e, blocks, 0, full, ())
        m = build_manifest(snap, self.p_local, token_ids=self.tokens[i], dst_tp=c.dst_tp, dst_cp=1)
        self.send(i, "Handoff", e, manifest=m.to_json_dict())
        self.frozen_manifest[i] = m
        r.epoch, r.phase, r.sent, r.phit, r.dst = e, AWAIT_READY, 0, 0, ()

    def _next_epoch(self, r: ReqState) -> int:
        """Every attempt, a refetch after a retraction included, opens a new epoch (the
        ``retract_keeps_epoch`` bug re-opens the old one for a request computed again)."""
        if "retract_keeps_epoch" in self.m and r.moves > 0 and r.epoch > 0:
            return r.epoch
        return r.epoch + 1

    def PrefillRecvReady(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        i, r = req, self.req[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.p_up or msg != "Ready" or r.status != RUNNING or r.phase != AWAIT_READY:
            raise self._ne("PrefillRecvReady", i)
        if epoch != r.epoch or self.fenced(msg):
            raise StaleError(f"Ready of epoch {epoch}, inc {self.step_inc}; r{i} at {r.epoch}")
        header, _ = self.wire.take(ch, k)
        r.phase, r.sent, r.phit, r.dst = SENDING, 0, header["idx"], tuple(header["dst"])
        self.rinc[i] = header.get("inc", 0) if self.config.restarts else 0

    def PrefillSendChunk(self, req: int) -> None:
        """Send the next item, rank-major: a rank's chunks, then that rank's RankDone."""
        i, r = req, self.req[req]
        if not self.p_up or r.status != RUNNING or r.phase != SENDING:
            raise self._ne("PrefillSendChunk", i)
        per = self.n - r.phit
        total = self.P.tp * (per + 1)
        if per == 0 and "zero_block_never_done" in self.m:
            r.phase, r.sent = AWAIT_ACK, total  # the bug: nothing to send, so no RankDone
            return
        rank, pos = divmod(r.sent, per + 1)
        if pos < per:
            j = r.phit + pos  # logical block
            self.send(
                i,
                "Chunk",
                r.epoch,
                rank * per + pos,
                r.payloads[rank][j],
                rank=rank,
                block=j,
                dst=r.dst[pos],
                checksum=r.checksums[rank][j],
                inc=self.rinc[i],
            )
        else:
            self.send(i, "RankDone", r.epoch, rank)
        r.sent += 1
        if r.sent < total:
            return
        if "release_before_install" in self.m:  # the bug: free once the sends are posted
            rid = self.rid(i)
            self.P.alloc.free(pin_name(rid, r.epoch))
            self.P.alloc.free(rid)
            r.phase, r.sent, r.phit = IDLE, 0, 0
        else:
            r.phase = AWAIT_ACK

    def PrefillRelease(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        i, r = req, self.req[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.p_up or msg != "Ack" or r.phase != AWAIT_ACK or self.p_status(i) != COMPLETE:
            raise self._ne("PrefillRelease", i)
        if epoch != r.epoch or self.fenced(msg):
            raise StaleError(f"Ack of epoch {epoch}, inc {self.step_inc}; r{i} at {r.epoch}")
        self.wire.take(ch, k)
        rid = self.rid(i)
        self.P.alloc.free(pin_name(rid, r.epoch))
        self.P.alloc.free(rid)
        if "release_keeps_wait" in self.m:  # the bug: the sender still waits for the Ack
            return
        r.phase, r.payloads, r.checksums = IDLE, [], []
        r.sent, r.phit = 0, 0  # sender registers: reset when the attempt ends

    def PrefillResume(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        i, r = req, self.req[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.p_up or msg != "Nack" or r.status != RUNNING or r.phase == IDLE:
            raise self._ne("PrefillResume", i)
        if epoch != r.epoch or self.fenced(msg):
            raise StaleError(f"Nack of epoch {epoch}, inc {self.step_inc}; r{i} at {r.epoch}")
        if not writes_drained(self, i, r.epoch):
            raise FrozenError(f"writes of r{i} epoch {r.epoch} still read the snapshot")
        self.wire.take(ch, k)
        if not self.wire.revocable:  # decode could not fence: it holds the blocks till told
            self.send(i, "Quiesced", r.epoch)
        self.P.alloc.free(pin_name(self.rid(i), r.epoch))  # thawed: writable again
        r.phase, r.payloads, r.checksums = IDLE, [], []
        r.sent, r.phit = 0, 0  # sender registers: reset when the attempt ends

    def PrefillTimeout(self, req: int) -> None:
        """Bounded exit without decode's word: flush own writes, free, tell decode."""
        i, r = req, self.req[req]
        if not self.p_up or r.phase == IDLE or not self._timeouts_allowed():
            raise self._ne("PrefillTimeout", i)
        if not self.wire.revocable and not writes_drained(self, i, r.epoch):
            raise InUseError(f"writes of r{i} epoch {r.epoch} are in flight; none can be revoked")
        self._drop_chunks(i, r.epoch)  # our writes in flight fail (if the transport can)
        rid = self.rid(i)
        if r.status != RUNNING:
            self._drop_prefill(i)
            self.send(i, "Quiesced", r.epoch)
        elif "source_resumes_on_timeout" in self.m:
            self.P.alloc.free(pin_name(rid, r.epoch))  # the bug: thaws without a Nack
        else:
            self.P.alloc.free(pin_name(rid, r.epoch))
            self.P.alloc.free(rid)
            r.status, r.ghost = FAILED, r.ghost | G_END_FAILED
            self.send(i, "Quiesced", r.epoch)
        r.phase, r.payloads, r.checksums = IDLE, [], []
        r.sent, r.phit = 0, 0  # sender registers: reset when the attempt ends

    def PrefillQuiesce(self, req: int) -> None:
        """An ended request: stop local copies, wait for own writes, free, tell decode."""
        i, r = req, self.req[req]
        if not self.p_up or r.status not in ENDED:
            raise self._ne("PrefillQuiesce", i)
        if self.p_status(i) == NONE and self.h_status(i) == NONE and r.phase == IDLE:
            raise self._ne("PrefillQuiesce", i)
        if r.phase != IDLE and not writes_drained(self, i, r.epoch):
            raise InUseError(f"writes of r{i} epoch {r.epoch} are in flight")
        step_guard(self, i, "p", "free")
        if r.phase != IDLE:
            self.send(i, "Quiesced", r.epoch)
        self._drop_prefill(i)
        r.phase, r.stored, r.loaded = IDLE, 0, 0
        r.sent, r.phit = 0, 0

    def PrefillDiscard(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """Drop a message to prefill that nothing will ever use."""
        i, r = req, self.req[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.p_up or msg not in ("Ready", "Ack", "Nack"):
            raise self._ne("PrefillDiscard", i)
        stale = epoch != r.epoch or r.status in ENDED or r.phase == IDLE
        stale = stale or (msg == "Ready" and r.phase != AWAIT_READY)
        stale = stale or (msg == "Ack" and r.phase != AWAIT_ACK)
        if not stale and not self.fenced(msg):
            raise self._ne("PrefillDiscard", i)
        self.wire.take(ch, k)
