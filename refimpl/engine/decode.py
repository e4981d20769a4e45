"""The decode worker's actions (spec ``actions_decode``), on real tensors.

Decode learns everything about the source from the manifest (layout, heads, TP degree,
checksums); it shares no Python object with the prefill side. A chunk is a one-sided
write to the physical blocks named in its header (decode's Ready told prefill where):

- attempt ``dep`` fenced (decode closed the connection): the write fails;
- attempt ``dep`` held (reserved, filling or quarantined): the bytes are checked against
  the chunk's checksum and installed only if they match (else the attempt is corrupt);
- anything else: the bytes land, unchecked, in whatever those blocks hold now. This is
  the damage the mutants show (vllm #32255), and the ghost flag ``G_FOREIGN`` records it.

The data plane is the ``Receiver``'s: ``manifest_gate``, ``source_of``, ``chunk_intact``,
``land_shard`` (``refimpl.api``). Not ``install_block`` whole: it refuses a canonical block
unlike the manifest at once (the spec: at ``DecodeValidate``) and never lands outside its
attempt's reserved blocks, where a write here lands as ``dst`` says (G_FOREIGN).
"""

from __future__ import annotations

from refimpl.api.install import check_blocks, chunk_intact
from refimpl.api.layers import land_shard, source_of
from refimpl.engine.base import (
    PREFIX_CACHE,
    RX_COMMITTED,
    RX_NONE,
    RX_QUARANTINED,
    RX_VALIDATED,
    RX_WAITING,
    NotEnabled,
    RankError,
)
from refimpl.engine.data import token_chain
from refimpl.engine.inflight import step_guard
from refimpl.engine.prefill import PrefillActions
from refimpl.engine.transfer_rules import may_fence, quarantine_over
from refimpl.engine.wire import parse
from refimpl.errors import (
    CancelledError,
    CapacityError,
    ChecksumError,
    IncompleteError,
    ManifestError,
    RefcountError,
    StaleError,
)
from spec.manifest import from_json_dict
from spec.state import CANCELLED, FAILED, FILLING, FINISHED, G_FOREIGN, G_POSTEND, G_STALE, RUNNING

_HANDOFFS = ("Handoff", "HandoffBadManifest")


class DecodeActions(PrefillActions):
    # ------------------------------------------------------------ helpers
    def _prefix_hit(self, tokens: tuple[int, ...]) -> int:
        """Leading full blocks whose content-hash chain matches the cached prefix."""
        if not self.prefix_blocks:
            return 0
        chain = token_chain(tokens, self.d_local.block_size)
        both = min(len(self.prefix_chain), len(chain))  # every pair of the two equal: all
        pairs = zip(self.prefix_chain, chain, strict=False)
        return next((k for k, (mine, theirs) in enumerate(pairs) if mine != theirs), both)

    def _room(self, i: int, need: int) -> bool:
        """Room on decode for request i's ``need`` blocks (and, with slots, its slot)."""
        return self.D.alloc.can_allocate(need)

    def _free_rx(self, i: int) -> None:
        """Free decode's replica of request i and its prefix reference (spec ``_free``).

        Reserved blocks are freed only when no write can land any more (all landed, the
        writer quiesced, or the attempt is fenced); the caller knows which.
        """
        x, rid, a = self.rx[i], self.rid(i), self.D.alloc
        if x.phase in (RX_VALIDATED, RX_COMMITTED):
            a.free(rid)
        elif x.phase == RX_WAITING:
            self.release_all(self.D, rid)
        elif x.phase == RX_QUARANTINED:
            a.unquarantine_and_free(rid, x.dep)
        self._forget_rx(i)

    def _forget_rx(self, i: int) -> None:
        """Drop the prefix reference and the attempt's progress (its blocks are gone)."""
        x = self.rx[i]
        self.D.alloc.free(self.rid(i) + "#pfx")
        x.phase, x.own, x.landed, x.rmask, x.rcnt = RX_NONE, (), 0, 0, 0

    def _full_chunks(self, i: int) -> int:
        x = self.rx[i]
        assert x.manifest is not None
        return (1 << (x.manifest.src_tp * len(x.own))) - 1

    # ------------------------------------------------------------ handoff: receiver
    def DecodeReserve(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """Pre-allocate the blocks the handoff will write (only the missing suffix)."""
        i, x = req, self.rx[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.d_up or msg not in _HANDOFFS or x.phase != RX_NONE:
            raise self._ne("DecodeReserve", i)
        if self.req[i].status != RUNNING:
            raise self._ne("DecodeReserve", i)
        if epoch <= x.dep or self.fenced(msg):
            raise StaleError(f"Handoff of epoch {epoch}; decode has seen epoch {x.dep}, or inc")
        text = self.wire.entries(ch)[k][0]
        m = from_json_dict(parse(text)["manifest"])  # the sender built it: parses
        reasons = self.manifest_refusals(text)
        hit = self._prefix_hit(m.token_ids)
        need = m.num_blocks - hit
        if not self.D.alloc.can_allocate(need):
            raise CapacityError(f"r{i} needs {need} decode blocks, {self.D.alloc.num_free} free")
        self.wire.take(ch, k)
        rid = self.rid(i)
        own = self.D.alloc.reserve(rid, need, epoch=epoch)
        if hit:
            self.D.alloc.incref(rid + "#pfx", self.prefix_blocks[:hit])
        x.dep, x.phase, x.own, x.manifest = epoch, RX_WAITING, tuple(own), m
        x.landed, x.rmask, x.rcnt = 0, 0, 0
        x.mismatch, x.corrupt, x.fenced, x.failed = reasons, False, False, False
        self.send(i, "Ready", epoch, hit, dst=own)

    def DecodeReject(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """No room, the request has ended, or an incompatible manifest refused at intake
        (nothing reserved): refuse the attempt with a Nack."""
        i, x = req, self.rx[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.d_up or msg not in _HANDOFFS or x.phase != RX_NONE or epoch <= x.dep:
            raise self._ne("DecodeReject", i)
        if self.fenced(msg):
            raise self._ne("DecodeReject", i)
        text = self.wire.entries(ch)[k][0]
        m = from_json_dict(parse(text)["manifest"])
        room = self._room(i, m.num_blocks - self._prefix_hit(m.token_ids))
        if self.req[i].status == RUNNING and room and not self.manifest_refusals(text):
            raise self._ne("DecodeReject", i)
        self.wire.take(ch, k)
        dep = x.dep if "reject_unfenced" in self.m else epoch  # the mutant: no fence
        x.dep, x.mismatch, x.corrupt, x.fenced, x.failed = dep, (), False, False, False
        self.send(i, "Nack", epoch)

    def DecodeReceiveChunk(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """A one-sided write lands wherever its header points, held or not (the Receiver's
        check and landing; not ``install_block``: see the module's docstring)."""
        i, x = req, self.rx[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.d_up or msg not in ("Chunk", "ChunkCorrupt", "ChunkUnstaged"):
            raise self._ne("DecodeReceiveChunk", i)
        text, data = self.wire.entries(ch)[k]
        h = parse(text)
        if self.fenced(msg):  # to a dead incarnation's registration: the write fails
            self.wire.take(ch, k)
            return
        # decode reserved for some epoch of this request (or, with restart_keeps_pool, the
        # old registration maps a write of the sender's layout onto the new pool)
        manifest = x.manifest if x.manifest is not None else self.frozen_manifest[i]
        assert manifest is not None
        geo, pieces = source_of(manifest, self.D.tp)  # the Receiver's reading of the manifest
        shard = pieces.get(h["rank"], ())  # a replica rank's heads: nothing to land
        if epoch == x.dep and x.fenced and self.wire.revocable:
            self.wire.take(ch, k)  # fails at the closed connection
            return
        if epoch == x.dep and x.phase in (RX_WAITING, RX_QUARANTINED):
            ok = chunk_intact(h, data)  # hashed before a byte is written (spec: nothing
            if ok and x.phase == RX_WAITING:  # of a corrupt chunk is installed)
                self.D.alloc.check_write(self.rid(i), [h["dst"]])
            self.wire.take(ch, k)
            if ok:  # verified: install (resharded, relaid out)
                land_shard(self.D, shard, geo, data, h["dst"])
            else:
                x.corrupt = True  # nothing installed
            x.landed |= 1 << idx
            return
        self.wire.take(ch, k)
        land_shard(self.D, shard, geo, data, h["dst"])  # unchecked, not ours (the Receiver
        self.req[i].ghost |= G_FOREIGN  # refuses this by design: the mutants' damage)

    def DecodeReceiveDone(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        i, x = req, self.rx[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.d_up or msg != "RankDone" or x.phase != RX_WAITING:
            raise self._ne("DecodeReceiveDone", i)
        if self.fenced(msg):
            raise StaleError(f"RankDone of incarnation {self.step_inc}; prefill is newer")
        stale = epoch != x.dep
        if stale and "stale_epoch_accepted" not in self.m:
            raise StaleError(f"RankDone of epoch {epoch}; decode waits on epoch {x.dep}")
        self.wire.take(ch, k)
        x.rmask |= 1 << idx
        x.rcnt = x.rcnt + 1 if "duplicate_rank_counted" in self.m else 0
        if stale:
            self.req[i].ghost |= G_STALE

    def DecodeValidate(self, req: int) -> None:
        """Manifest, checksums, every rank: only then is the replica complete (read-only)."""
        i, x, r = req, self.rx[req], self.req[req]
        if not self.d_up or x.phase != RX_WAITING:
            raise self._ne("DecodeValidate", i)
        m = x.manifest
        assert m is not None
        ghost = 0
        if r.status != RUNNING:
            if r.status != CANCELLED or "cancel_ignored" not in self.m:
                raise CancelledError(f"r{i} has ended; nothing is installed after that")
            ghost = G_POSTEND
        if x.failed and "validate_after_decode_failure" not in self.m:
            raise CancelledError(f"decode failed r{i} epoch {x.dep}; nothing of it is installed")
        if "duplicate_rank_counted" in self.m:
            if x.rcnt < m.src_tp:
                raise RankError(f"{x.rcnt} RankDones counted of {m.src_tp}")
        elif x.rmask != (1 << m.src_tp) - 1:
            raise RankError(f"ranks {x.rmask:b} reported of {m.src_tp}")
        if "partial_as_complete" not in self.m:
            if x.landed != self._full_chunks(i):
                raise IncompleteError(f"chunks {x.landed:b} landed of {self._full_chunks(i):b}")
            if x.corrupt:
                raise ChecksumError(f"a chunk of r{i} epoch {x.dep} failed its checksum")
            self._check_end_to_end(i)
        if x.mismatch and "mismatch_installed" not in self.m:
            raise ManifestError(list(x.mismatch))
        self.D.alloc.commit(self.rid(i), x.dep)  # RESERVED -> OWNED: read-only, validated
        x.phase = RX_VALIDATED
        r.ghost |= ghost

    def _check_end_to_end(self, i: int) -> None:
        """Every installed block, reassembled from the decode ranks, hashes to the
        manifest's checksum (resharding and layout conversion included)."""
        x, hit = self.rx[i], self.hit(i)
        assert x.manifest is not None  # the Receiver's end-to-end check (``check_blocks``)
        check_blocks(self.D, x.own, x.manifest, [hit + k for k in range(len(x.own))])

    def DecodeCommit(self, req: int) -> None:
        """The commit point: decode becomes the one writer and tells prefill (Ack)."""
        i, x, r = req, self.rx[req], self.req[req]
        if not self.d_up or x.phase != RX_VALIDATED:
            raise self._ne("DecodeCommit", i)
        if x.failed and "validate_after_decode_failure" not in self.m:
            raise CancelledError(f"decode failed r{i} epoch {x.dep}; no commit of it")
        status, ghost = r.status, 0
        if r.status == RUNNING:
            pass
        elif r.status == FAILED and "error_overwritten" in self.m:
            status = RUNNING  # the bug: a later success overwrites the failure
        elif r.status == CANCELLED and "cancel_ignored" in self.m:
            ghost = G_POSTEND
        else:
            raise CancelledError(f"r{i} has ended; no commit after that")
        x.phase = RX_COMMITTED
        r.status, r.ghost = status, r.ghost | ghost
        self.send(i, "Ack", x.dep)

    def DecodeStep(self, req: int) -> None:
        i, x = req, self.rx[req]
        bug = "validate_after_decode_failure" in self.m
        if self.d_up and x.failed and x.phase != RX_NONE and not bug:
            raise CancelledError(f"decode failed r{i} epoch {x.dep}; no step of it")
        if not self.d_up or x.phase != RX_COMMITTED or self.req[i].status != RUNNING:
            raise self._ne("DecodeStep", i)
        if self.config.async_steps:
            raise self._ne("DecodeStep", i)
        logical = self.D.alloc.blocks_of(self.rid(i) + "#pfx") + x.own
        self._append_token(i, self.D, logical, self.rid(i))

    def DecodeFinish(self, req: int) -> None:
        i, x = req, self.rx[req]
        if not self.d_up or x.phase != RX_COMMITTED or self.req[i].status != RUNNING:
            raise self._ne("DecodeFinish", i)
        step_guard(self, i, "d", "free")
        self.req[i].status = FINISHED
        self._free_rx(i)

    def DecodeAbort(self, req: int) -> None:
        """Give the attempt up (cancelled, failed, or it failed validation). While a writer
        may still land bytes, a cancelled attempt's blocks are quarantined until it
        quiesces; an invalid attempt of a running request is fenced and freed at once."""
        i, x = req, self.rx[req]
        if not self.d_up or x.phase in (RX_NONE, RX_QUARANTINED):
            raise self._ne("DecodeAbort", i)
        invalid = x.phase == RX_WAITING and (x.corrupt or bool(x.mismatch) or x.failed)
        if self.req[i].status == RUNNING and not invalid:
            raise self._ne("DecodeAbort", i)
        step_guard(self, i, "d", "free")
        if x.phase != RX_COMMITTED:
            self.send(i, "Nack", x.dep)
        if x.phase == RX_WAITING and x.landed != self._full_chunks(i):  # a writer may land
            if invalid and self.req[i].status == RUNNING and may_fence(self):  # fence, free
                self._drop_chunks(i, x.dep)
                x.fenced = True
                self._free_rx(i)
                return
            if invalid and self.req[i].status == RUNNING:  # no revoke: quarantine
                self.D.alloc.quarantine(self.rid(i))
                x.phase = RX_QUARANTINED
                return
            if "free_on_cancel_in_flight" in self.m:
                self.D.alloc.free(self.rid(i))  # the bug: frees under the in-flight write
                self._forget_rx(i)
                return
            self.D.alloc.quarantine(self.rid(i))
            x.phase = RX_QUARANTINED
            return
        self._free_rx(i)

    def DecodeAbortFenced(self, req: int) -> None:
        """Give up an ended request's attempt while a writer may land, on a transport that
        revokes writes: fence it (its writes in flight fail) and free at once."""
        i, x = req, self.rx[req]
        ended = self.req[i].status != RUNNING
        if not self.d_up or x.phase != RX_WAITING or not ended or not may_fence(self):
            raise self._ne("DecodeAbortFenced", i)
        if x.landed == self._full_chunks(i):  # nothing more can land: DecodeAbort frees
            raise self._ne("DecodeAbortFenced", i)
        step_guard(self, i, "d", "free")
        self.send(i, "Nack", x.dep)
        self._drop_chunks(i, x.dep)
        x.fenced = True
        self._free_rx(i)

    def DecodeReclaim(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """The writer has quiesced: the attempt's blocks are free at last."""
        i, x = req, self.rx[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.d_up or msg != "Quiesced" or x.phase not in (RX_WAITING, RX_QUARANTINED):
            raise self._ne("DecodeReclaim", i)
        if epoch != x.dep or self.fenced(msg):
            raise StaleError(f"Quiesced of epoch {epoch}; decode holds epoch {x.dep}, or inc")
        if x.phase != RX_QUARANTINED and self.req[i].status == RUNNING:
            raise self._ne("DecodeReclaim", i)  # prefill failed it: DecodeAbort runs first
        self.wire.take(ch, k)
        self._free_rx(i)

    def DecodeTimeout(self, req: int) -> None:
        """Bounded exit without the peer: fence the attempt's writes, free, Nack."""
        i, x = req, self.rx[req]
        if not self.d_up or x.phase not in (RX_WAITING, RX_QUARANTINED):
            raise self._ne("DecodeTimeout", i)
        if not self._timeouts_allowed():
            raise self._ne("DecodeTimeout", i)
        if self.d_status(i) == FILLING and "no_timeout_while_filling" in self.m:
            raise self._ne("DecodeTimeout", i)
        if not may_fence(self):  # no revoke: the attempt's writes may still land
            if x.phase == RX_QUARANTINED:  # the longer timeout: past the writer's lifetime
                if not quarantine_over(self, i):
                    raise self._ne("DecodeTimeout", i)
                self._free_rx(i)
                return
            if x.landed != self._full_chunks(i):
                self.send(i, "Nack", x.dep)
                self.D.alloc.quarantine(self.rid(i))
                x.phase = RX_QUARANTINED
                return
        self._drop_chunks(i, x.dep)  # the connection is closed: its writes fail
        x.fenced = True
        if x.phase != RX_QUARANTINED:
            self.send(i, "Nack", x.dep)
        self._free_rx(i)

    def DecodeFail(self, req: int) -> None:
        """Decode's own transfer error (checksum, load timeout, dead peer) on the attempt
        it waits for: the attempt is failed on decode; DecodeAbort gives its blocks up."""
        i, x = req, self.rx[req]
        if not self.config.decode_failure or not self.d_up or x.phase != RX_WAITING:
            raise self._ne("DecodeFail", i)
        if x.failed:
            raise self._ne("DecodeFail", i)
        x.failed = True

    def DecodeEvictPrefix(self) -> None:
        """Evict the cached shared prefix (only when nobody references it)."""
        if not self.d_up or not self.prefix_blocks:
            raise NotEnabled("DecodeEvictPrefix: no prefix cached")
        refs = self.pfx_refs()
        if refs and "evict_referenced_prefix" not in self.m:
            raise RefcountError(f"the prefix blocks are referenced by {refs} requests")
        blocks = list(self.prefix_blocks)
        for _ in range(1 + refs):  # the bug (refs > 0): drops references it does not hold
            self.D.alloc.decref(PREFIX_CACHE, blocks)
        self.prefix_blocks, self.prefix_chain = (), []

    def DecodeDiscard(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        """Drop a control message to decode that nothing will ever use."""
        i, x = req, self.rx[req]
        ch, k = self.find(i, msg, epoch, idx)
        if not self.d_up or msg not in (*_HANDOFFS, "RankDone", "Quiesced"):
            raise self._ne("DecodeDiscard", i)
        if msg in _HANDOFFS:
            stale = epoch <= x.dep
        elif msg == "RankDone":
            stale = epoch != x.dep or x.phase != RX_WAITING
        else:
            stale = epoch != x.dep or x.phase not in (RX_WAITING, RX_QUARANTINED)
        if not stale and not self.fenced(msg):
            raise self._ne("DecodeDiscard", i)
        if msg == "RankDone" and "stale_epoch_accepted" in self.m and x.phase == RX_WAITING:
            raise self._ne("DecodeDiscard", i)  # the mutant counts it instead
        self.wire.take(ch, k)
