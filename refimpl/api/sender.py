"""``Sender``: the source end of a handoff, model-agnostic (pools + geometry + transport).

    tx = Sender(pools, geometry, transport, model)
    m = tx.offer("req-1", token_ids, blocks=the_blocks_to_send, dst_tp=1)
    while not tx.state("req-1").final: tx.poll("req-1")   # or let handoff() drive it

``offer`` pins exactly the blocks it sends (``blocks``, default: the first ``ceil(len(
token_ids) / block_size)`` blocks of the request, so decode room is neither pinned nor
sent) and hashes each canonical block (every head, heads_major) for the manifest. Every
end of the attempt (ack, nack, abort, timeout) drops the pin (``held()``: what is still
held). Each offer is a new attempt at a higher epoch (default: this sender's last + 1),
so a late message of an old attempt is fenced; a reply counts only with this attempt's
epoch as an int; a malformed ``nack`` still ends the attempt (``wire``).

Layer by layer, as prefill computes each layer (a KV connector's ``save_kv_layer``):
``tx.offer(rid, token_ids, blocks=..., layers=L)``, then ``tx.send_layer(rid, layer)``
per layer computed. A streamed offer pins nothing; ``send_layer`` copies the layer of
every sent block (into the seal's hash) at once: what leaves is what was there then.

``Sender(..., rank=r)`` is one TP rank's Sender in its own process, with that rank's
pools only (``KVGeometry.make_rank_pools``); every rank offers the same request layer by
layer, with the same ``epoch`` (required: the router's attempt number, so a restarted
rank agrees with the others). A rank that hears the receiver answer a newer epoch than
its own ends its attempt and tells the others (``RankAgreement``, naming rank and
epochs); one rank's ``abort`` reaches every sibling rank and the receiver with its reason;
``forget(rid)`` drops an ended offer's record (memory stays bounded by the live ones).

Nacked or aborted on a transport whose writes cannot be taken back (``revocable =
False``), the Sender ends the attempt (and says so: its ``Quiesced``) only once none of
its writes of the attempt is pending at the transport (``writes_pending``: they all
landed or failed); till then its state and pins stay and a later ``poll`` ends it
(``refimpl.api.unrevocable.ends``; bug switches ``quiesced_at_nack``, ``quiesced_at_abort``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.intake import revocable
from refimpl.api.stream import Buffers, LayerOffers, _Offer
from refimpl.api.switches import (
    RELEASE_BEFORE_INSTALL,
    SENDER_SWITCHES,
    STALE_INCARNATION_ACCEPTED,
    check_switches,
)
from refimpl.api.unrevocable.ends import AttemptEnds
from refimpl.api.wire import (
    ABORT,
    ACK,
    MANIFEST,
    NACK,
    READY,
    Incarnated,
    Incarnations,
    State,
    channels,
    epoch_of,
    fence,
    inc_of,
    peer_failed,
    reasons_of,
    stamp,
)
from refimpl.checksum import is_checksum
from refimpl.chunks import Snapshot, build_manifest, freeze, release, send_chunks
from refimpl.chunks import manifest_checksums as canonical_sums
from refimpl.engine.data import RankPools
from refimpl.errors import ChunkError, InUseError
from refimpl.transport import Transport
from spec import shardmap as sm
from spec.manifest import Manifest


class Sender(LayerOffers, Incarnated, AttemptEnds):
    """The source side: offers a request's KV, sends chunks on ``ready``, releases at the end."""

    def __init__(
        self,
        pools: RankPools,
        geometry: KVGeometry,
        transport: Transport,
        model: ModelIdentity,
        *,
        rank: int | None = None,
        blocks_per_chunk: int | None = None,
        mutants: Iterable[str] = (),
        incarnation: int = 0,
    ) -> None:
        """``rank``: this Sender is TP rank ``rank`` of ``geometry`` alone (its own
        process), ``pools`` are that rank's (``geometry.make_rank_pools(rank, n)``).
        ``blocks_per_chunk``: blocks per streamed chunk (default: all, one per layer).
        ``mutants``: bug switches (``refimpl.api.switches``), for demonstrations.
        ``incarnation``: this process's restarts so far (a restarted prefill builds a
        new Sender with the next one, from the engine's membership): every message
        carries it, and the receiver refuses an older one's (``peer_restarted``)."""
        self.mutants = check_switches(mutants, SENDER_SWITCHES, "Sender")
        if not revocable(transport) and not callable(getattr(transport, "writes_pending", None)):
            raise ValueError(
                f"Sender: {type(transport).__name__} has revocable=False but no "
                "writes_pending(channel, epoch): a nacked Sender could not tell when its "
                "writes are over (refimpl.transport)"
            )
        stale_ok = STALE_INCARNATION_ACCEPTED in self.mutants
        self.inc = Incarnations(incarnation, "Sender", stale_ok)
        if rank is None:
            geometry.check_pools(pools, "sender pools")
            self.ranks = list(pools.primaries)  # (source rank, index of its pool here)
            self._pool_of = {r: r for r in self.ranks}
        else:
            geometry.check_rank_pools(pools, rank)
            primary = sm.tp_is_primary(geometry.kv_heads, geometry.tp, rank)
            self.ranks = [rank] if primary else []  # a replica rank sends nothing
            self._pool_of = {rank: 0}
        if geometry.cp != 1:
            raise ValueError(f"Sender: cp={geometry.cp}; a sender worker holds cp=1")
        self.rank, self.pools, self.geometry, self.transport = rank, pools, geometry, transport
        self.model = model
        self.local = geometry.to_local_config(model)
        self._offers: dict[str, _Offer] = {}
        self._buffers, self.blocks_per_chunk = Buffers(), blocks_per_chunk  # (streamed)

    # ------------------------------------------------------------ queries
    def state(self, request_id: str) -> State:
        return self._offers[request_id].state

    def reasons(self, request_id: str) -> list[str]:
        return list(self._offers[request_id].reasons)

    def stats(self, request_id: str) -> tuple[int, int]:
        """(chunks sent, payload bytes sent) of the request's attempt."""
        return self._offers[request_id].chunks, self._offers[request_id].bytes_sent

    def held(self) -> dict[str, tuple[int, ...]]:
        """Blocks pinned by attempts that have not ended (empty once all ended)."""
        return {rid: o.snaps[0].block_ids for rid, o in self._offers.items() if o.snaps}

    def records(self) -> int:
        """Requests this Sender keeps a record of (live or ended, not forgotten)."""
        return len(self._offers)

    def peer_restarted(self, incarnation: int) -> None:
        """The receiver's process came back as ``incarnation`` (the engine's membership
        says so): from now on a reply of an older one (a dead receiver's ready, ack or
        nack) is refused by name and changes nothing. An attempt bound to the dead
        receiver still ends by its timeout (``abort``), as the spec's ``PrefillTimeout``."""
        self.inc.restarted(incarnation)

    def forget(self, request_id: str) -> None:
        """Drop an ended offer's record (a later offer starts at epoch 1 unless told)."""
        o = self._offers.get(request_id)
        if o is not None and not o.state.final:
            wait = "its end waits for its writes: poll it" if o.aborting or o.nacked else ""
            raise InUseError(f"{request_id!r} is still {o.state.value}; {wait or 'abort it first'}")
        self._offers.pop(request_id, None)

    # ------------------------------------------------------------ commands
    def offer(
        self,
        request_id: str,
        token_ids: Sequence[int],
        *,
        blocks: Sequence[int] | None = None,
        epoch: int | None = None,
        dst_tp: int = 1,
        dst_cp: int = 1,
        prefix_blocks: int = 0,
        free_source: bool = False,
        layers: int | None = None,
        checksums: Sequence[str] | None = None,
    ) -> Manifest:
        """Freeze the blocks to send, build the manifest and send it. Nothing is held on error.

        ``blocks``: the request's blocks holding ``token_ids`` (logical order, from block
        0); ``prefix_blocks`` of them the receiver already has and are not sent.
        ``epoch``: this attempt's, above every earlier one of the request here; default:
        the next one (1 for a request this sender has not offered). ``layers``: a streamed
        offer of all ``layers`` layers, sent by ``send_layer`` as each is computed.
        ``checksums``: the writer's xxh3-64 of each of ``blocks`` (``refimpl.checksum``,
        taken when prefill wrote them), so the offer does not read the KV to hash it; a
        whole-block offer of canonical blocks only (one rank, heads_major). Not trusted
        further: the receiver hashes every chunk before counting it, so a stale one
        fails the handoff (``ChecksumError``, nothing kept), never installs other bytes.
        """
        if self.rank is not None and epoch is None:
            raise ValueError(
                f"{request_id!r}: a Sender of one rank (rank={self.rank}) needs epoch=: every "
                "rank of an attempt offers the same one (refimpl.api.ranks.Epochs chooses it)"
            )
        old = self._offers.get(request_id)
        if old is not None and not old.state.final:
            raise ValueError(f"{request_id!r} already has an attempt in state {old.state.value}")
        last = old.epoch if old is not None else 0
        rinc = old.rinc if old is not None else 0  # the receiver's last Ready: its writes'
        if epoch is None:
            epoch = last + 1
        if type(epoch) is not int or epoch <= last:
            raise ValueError(
                f"{request_id!r}: epoch {epoch!r} is not after its last attempt's epoch {last}; "
                "a retry needs a new epoch (leave epoch=None for the next one)"
            )
        alloc, g = self.pools.alloc, self.geometry
        need = g.blocks_for(len(token_ids))
        if blocks is None:
            blocks = alloc.blocks_of(request_id)[:need]
        if len(blocks) != need:
            raise ChunkError(
                f"{request_id!r}: {len(blocks)} blocks for {len(token_ids)} tokens "
                f"at block_size={g.block_size}; needs {need}"
            )
        sent = list(blocks)[prefix_blocks:]
        given = None if checksums is None else self._given(request_id, checksums, need, layers)
        if layers is not None or self.rank is not None:
            return self._offer_stream(
                rinc,
                request_id,
                token_ids,
                sent,
                epoch,
                dst_tp,
                dst_cp,
                prefix_blocks,
                free_source,
                layers,
            )
        snaps: list[Snapshot] = []
        try:
            for r in self.pools.primaries:
                snaps.append(
                    freeze(
                        self.pools.pools[r],
                        request_id,
                        epoch,
                        first_block=prefix_blocks,
                        blocks=sent,
                        checksums=None if given is None else given[prefix_blocks:],
                    )
                )
            sums = canonical_sums(self.pools, sent, snaps[0].checksums)  # the one convention
            snap = Snapshot(request_id, epoch, tuple(sent), prefix_blocks, sums, ())
            m = build_manifest(snap, self.local, token_ids=token_ids, dst_tp=dst_tp, dst_cp=dst_cp)
        except Exception:
            for r, s in zip(self.pools.primaries, snaps, strict=False):
                release(self.pools.pools[r], s)
            raise
        self._offers[request_id] = _Offer(request_id, epoch, m, snaps, free_source, rinc=rinc)
        header = {"type": MANIFEST, "epoch": epoch, "manifest": m.to_json_dict()}
        stamp(header, self.inc.own)
        try:
            self.transport.send(channels(request_id).to_receiver, header)
        except Exception:
            self._end(self._offers.pop(request_id), State.ABORTED, [])
            raise
        return m

    def _given(
        self, rid: str, checksums: Sequence[str], need: int, layers: int | None
    ) -> list[str]:
        """The writer's checksums of an offer's blocks, checked (ValueError naming what
        is wrong): one per block, each 16 lowercase hex digits, of canonical blocks."""
        if layers is not None or self.rank is not None:
            raise ValueError(
                f"{rid!r}: checksums= is for a whole-block offer; a streamed one hashes "
                "each chunk as send_layer copies it"
            )
        if not self.pools.canonical:
            raise ValueError(
                f"{rid!r}: checksums= needs canonical blocks (one rank, heads_major): the "
                f"manifest's are of the whole block, these pools are tp={self.geometry.tp}, "
                f"{self.geometry.layout}"
            )
        sums = list(checksums) if not isinstance(checksums, str | bytes) else None
        if sums is None or len(sums) != need:
            n = "a string" if sums is None else len(sums)
            raise ValueError(f"{rid!r}: checksums: {n} for {need} blocks; one per block")
        if bad := [i for i, c in enumerate(sums) if not is_checksum(c)]:
            raise ValueError(
                f"{rid!r}: checksums[{bad[0]}] = {sums[bad[0]]!r:.40} is not an xxh3-64 "
                "(16 lowercase hex digits, refimpl.checksum)"
            )
        return sums

    def poll(self, request_id: str) -> int:
        """Handle the receiver's replies; returns the number of messages read."""
        msgs = self.transport.poll(self._replies(request_id))
        o = self._offers.get(request_id)
        for header, _ in msgs:
            if not isinstance(header, dict) or self.inc.stale(request_id, header):
                continue  # not a header, or a dead receiver's: ignored (named if stale)
            if o is None or o.state.final or o.aborting is not None:
                continue  # one after the end (or while an abort waits for writes): ignored
            kind, e = header.get("type"), epoch_of(header)
            if self.rank is not None and e is not None and e > o.epoch:
                self._disagree(o, e, kind == READY)  # the others are at a newer attempt
                continue
            if e != o.epoch:
                continue  # another attempt's reply (or an epoch that is not an int): fenced
            if kind == READY and o.state is State.OFFERED:
                o.rinc = inc_of(header) or 0  # the registration its writes target
                try:
                    if o.stream is not None:
                        o.state = State.SENDING
                        self._flush(o)
                    else:
                        self._send_chunks(o)
                        if o.free_source and RELEASE_BEFORE_INSTALL in self.mutants:
                            self.pools.alloc.free(request_id)  # the bug: before the ack
                except Exception as err:  # the transport refused a send: end, say why
                    self.abort(request_id, f"send failed: {type(err).__name__}: {err}")
            elif kind == ACK and o.state is State.SENDING:
                self._end(o, State.DONE, [])
                if o.free_source:
                    self.pools.alloc.free(request_id)
            elif kind in (NACK, ABORT):
                final = State.REFUSED if o.state is State.OFFERED else State.ABORTED
                if kind == NACK:  # its writes must be over before it says so (below)
                    o.nacked = (final, reasons_of(header), inc_of(header) or 0)
                    continue
                self._heard_abort(o, final, reasons_of(header))
        if o is not None:
            self._settle(o)  # a nack or an abort that waited for its writes
        rx = channels(request_id).to_receiver
        if o is not None and not o.state.final and (why := peer_failed(self.transport, [rx])):
            self._end(o, State.ABORTED, [f"the receiver's process is gone: {why}"])
            self._tell(o.request_id, o.epoch, o.reasons)  # the sibling ranks hear it too
        return len(msgs)

    def _replies(self, rid: str) -> str:
        return channels(rid).to_sender if self.rank is None else channels(rid).to_rank(self.rank)

    def crash(self) -> None:
        """Lose everything (a process crash): attempts forgotten, pools reset."""
        self._offers.clear()
        self.pools.reset()

    # ------------------------------------------------------------ internals
    def _send_chunks(self, o: _Offer) -> None:
        ch = channels(o.request_id).to_receiver
        for r, snap in zip(self.pools.primaries, o.snaps, strict=True):
            o.chunks += send_chunks(self.transport, ch, snap, rank=r, inc=o.rinc)
            o.bytes_sent += sum(len(p) for p in snap.payloads)
        o.state = State.SENDING

    def _end(self, o: _Offer, state: State, reasons: list[str]) -> None:
        for r, snap in zip(self.pools.primaries, o.snaps, strict=False):  # none if streamed
            release(self.pools.pools[r], snap)
        o.snaps, o.state, o.reasons, o.nacked = [], state, reasons, None
        if o.stream is not None:
            o.stream.end(acked=state is State.DONE)  # an ended attempt's copies go at once
        fence(self.transport, self._replies(o.request_id), o.epoch)  # its late replies too
