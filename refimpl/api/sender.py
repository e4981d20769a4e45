"""``Sender``: the source end of a handoff, model-agnostic (pools + geometry + transport).

    tx = Sender(pools, geometry, transport, model)
    m = tx.offer("req-1", token_ids, blocks=the_blocks_to_send, dst_tp=1)
    while not tx.state("req-1").final: tx.poll("req-1")   # or let handoff() drive it

``offer`` pins exactly the blocks it sends (``blocks``, default: the first
``ceil(len(token_ids) / block_size)`` blocks the request holds, so room reserved for
decoding is neither pinned nor sent) and hashes each canonical block (every head,
heads_major) for the manifest. Every end of the attempt (ack, nack, abort, timeout)
drops the pin; ``held()`` says what an attempt still holds. Each offer of a request is a
new attempt at a higher epoch (default: one after this sender's last for it), so a late
message of an old attempt is fenced by the new one. A reply counts only with this
attempt's epoch as an int; a malformed ``nack`` still ends the attempt (``wire``).

Layer by layer, as prefill computes each layer (a KV connector's ``save_kv_layer``):

    tx.offer("req-1", token_ids, blocks=..., layers=L)   # the manifest, before the KV
    for layer in range(L): ...compute it...; tx.send_layer("req-1", layer)

A streamed offer pins nothing (prefill still writes the blocks); each layer's bytes leave
as a copy, so the request may go on writing or free its blocks. ``Sender(..., rank=r)``
is one TP rank's Sender in its own process, with that rank's pools only
(``KVGeometry.make_rank_pools``); every rank offers the same request layer by layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.wire import (
    ABORT,
    ACK,
    CHUNK,
    MANIFEST,
    NACK,
    READY,
    SEAL,
    State,
    channels,
    epoch_of,
    reasons_of,
)
from refimpl.checksum import block_checksum, byte_view, bytes_checksum
from refimpl.chunks import Snapshot, build_manifest, freeze, release, send_chunks
from refimpl.engine.data import RankPools
from refimpl.errors import ChunkError
from refimpl.transport import Transport
from spec import shardmap as sm
from spec.manifest import Manifest


@dataclass
class _Stream:
    """A streamed offer's progress: layers computed, layers sent, each block's digest."""

    layers: int
    blocks: tuple[int, ...]  # the sent blocks' ids here
    computed: int = 0  # layers [0, computed) are written and may be sent
    sent: int = 0  # layers [0, sent) are on the wire
    digests: dict[tuple[int, int], Any] = field(default_factory=dict)  # (rank, j) -> xxh3
    sealed: bool = False


@dataclass
class _Offer:
    request_id: str
    epoch: int
    manifest: Manifest
    snaps: list[Snapshot]  # one per primary TP rank, all pinning the same block ids
    free_source: bool  # free the request's blocks here once the receiver acked
    state: State = State.OFFERED
    reasons: list[str] = field(default_factory=list)  # why it was refused or aborted
    chunks: int = 0
    bytes_sent: int = 0
    stream: _Stream | None = None


class Sender:
    """The source side: offers a request's KV, sends chunks on ``ready``, releases at the end."""

    def __init__(
        self,
        pools: RankPools,
        geometry: KVGeometry,
        transport: Transport,
        model: ModelIdentity,
        *,
        rank: int | None = None,
    ) -> None:
        """``rank``: this Sender is TP rank ``rank`` of ``geometry`` alone (its own
        process), ``pools`` are that rank's (``geometry.make_rank_pools(rank, n)``)."""
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
        self.rank = rank
        self.pools, self.geometry, self.transport, self.model = pools, geometry, transport, model
        self.local = geometry.to_local_config(model)
        self._offers: dict[str, _Offer] = {}

    # ------------------------------------------------------------ queries
    def state(self, request_id: str) -> State:
        return self._offers[request_id].state

    def reasons(self, request_id: str) -> list[str]:
        return list(self._offers[request_id].reasons)

    def stats(self, request_id: str) -> tuple[int, int]:
        """(chunks sent, payload bytes sent) of the request's attempt."""
        o = self._offers[request_id]
        return o.chunks, o.bytes_sent

    def held(self) -> dict[str, tuple[int, ...]]:
        """Blocks pinned by attempts that have not ended (empty once all ended)."""
        return {rid: o.snaps[0].block_ids for rid, o in self._offers.items() if o.snaps}

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
    ) -> Manifest:
        """Freeze the blocks to send, build the manifest and send it. Nothing is held on error.

        ``blocks``: the request's blocks holding ``token_ids`` (logical order, from block
        0); ``prefix_blocks`` of them the receiver already has and are not sent.
        ``epoch``: this attempt's, above every earlier one of the request here; default:
        the next one (1 for a request this sender has not offered). ``layers``: a streamed
        offer of all ``layers`` layers, sent by ``send_layer`` as each is computed.
        """
        old = self._offers.get(request_id)
        if old is not None and not old.state.final:
            raise ValueError(f"{request_id!r} already has an attempt in state {old.state.value}")
        last = old.epoch if old is not None else 0
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
        if layers is not None or self.rank is not None:
            return self._offer_stream(
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
                    )
                )
            if self.pools.canonical:
                sums = snaps[0].checksums  # the rank's block is the canonical block
            else:
                sums = tuple(block_checksum(full) for full in self.pools.gather(sent))
            snap = Snapshot(request_id, epoch, tuple(sent), prefix_blocks, sums, ())
            m = build_manifest(snap, self.local, token_ids=token_ids, dst_tp=dst_tp, dst_cp=dst_cp)
        except Exception:
            for r, s in zip(self.pools.primaries, snaps, strict=False):
                release(self.pools.pools[r], s)
            raise
        self._offers[request_id] = _Offer(request_id, epoch, m, snaps, free_source)
        self.transport.send(
            channels(request_id).to_receiver,
            {"type": MANIFEST, "manifest": m.to_json_dict()},
        )
        return m

    def _offer_stream(
        self,
        rid: str,
        token_ids: Sequence[int],
        sent: list[int],
        epoch: int,
        dst_tp: int,
        dst_cp: int,
        prefix_blocks: int,
        free_source: bool,
        layers: int | None,
    ) -> Manifest:
        g = self.geometry
        if layers != g.num_layers:
            raise ValueError(
                f"{rid!r}: layers={layers!r}; a streamed offer sends all {g.num_layers} layers "
                "(and a Sender of one rank offers layer by layer)"
            )
        if not_held := sorted(set(sent) - set(self.pools.alloc.blocks_of(rid))):
            raise ChunkError(f"blocks {not_held} to send are not held by {rid!r}")
        zeros = ("0" * 16,) * len(sent)  # the seals carry the digests: the KV is not there yet
        snap = Snapshot(rid, epoch, tuple(sent), prefix_blocks, zeros, ())
        m = build_manifest(snap, self.local, token_ids=token_ids, dst_tp=dst_tp, dst_cp=dst_cp)
        o = _Offer(rid, epoch, m, [], free_source, stream=_Stream(layers, tuple(sent)))
        self._offers[rid] = o
        if self.rank is None or self.rank == 0:  # rank 0 (always a primary) leads
            header = {"type": MANIFEST, "manifest": m.to_json_dict(), "layers": layers}
            if self.rank is not None:
                header["ranked"] = True
            self.transport.send(channels(rid).to_receiver, header)
        return m

    def send_layer(self, request_id: str, layer: int) -> int:
        """Layer ``layer`` of every sent block is written here: send it (or, before the
        receiver's ready, once it comes). Layers go in order; returns the chunks sent now."""
        o = self._offers.get(request_id)
        if o is None or o.stream is None:
            raise ValueError(f"{request_id!r} has no streamed offer here (offer(..., layers=L))")
        if o.state.final:
            return 0  # the attempt ended (refused, aborted): nothing more to send
        if type(layer) is not int or layer != o.stream.computed:
            raise ValueError(
                f"{request_id!r}: layer {layer!r} out of order; the next is {o.stream.computed}"
            )
        o.stream.computed += 1
        return self._flush(o) if o.state is State.SENDING else 0

    def _flush(self, o: _Offer) -> int:
        """Send every computed layer not sent yet, then the seals once all are out."""
        st, ch, n = o.stream, channels(o.request_id).to_receiver, 0
        assert st is not None
        pb = o.manifest.prefix_blocks
        while st.sent < st.computed:
            layer = st.sent
            for r in self.ranks:
                kv = self.pools.pools[self._pool_of[r]].kv
                for j, b in enumerate(st.blocks):
                    t = kv[b][layer]
                    payload = bytes(byte_view(t if t.device.type == "cpu" else t.cpu()))
                    st.digests.setdefault((r, j), xxhash.xxh3_64()).update(payload)
                    header = {
                        "type": CHUNK,
                        "request_id": o.request_id,
                        "epoch": o.epoch,
                        "block_index": pb + j,
                        "rank": r,
                        "layer": layer,
                        "checksum": bytes_checksum(payload),
                    }
                    self.transport.send(ch, header, payload)
                    n += 1
                    o.bytes_sent += len(payload)
            st.sent += 1
        if st.sent == st.layers and not st.sealed:
            st.sealed = True
            for r in self.ranks:
                digests = [st.digests[(r, j)].hexdigest() for j in range(len(st.blocks))]
                seal = {"type": SEAL, "request_id": o.request_id, "epoch": o.epoch}
                self.transport.send(ch, {**seal, "rank": r, "digests": digests})
        o.chunks += n
        return n

    def poll(self, request_id: str) -> int:
        """Handle the receiver's replies; returns the number of messages read."""
        ch = channels(request_id)
        msgs = self.transport.poll(ch.to_sender if self.rank is None else ch.to_rank(self.rank))
        o = self._offers.get(request_id)
        for header, _ in msgs:
            if not isinstance(header, dict) or o is None or o.state.final:
                continue  # not a header, or one after the end: ignored
            if epoch_of(header) != o.epoch:
                continue  # another attempt's reply (or an epoch that is not an int): fenced
            kind = header.get("type")
            if kind == READY and o.state is State.OFFERED:
                if o.stream is not None:
                    o.state = State.SENDING
                    self._flush(o)
                else:
                    self._send_chunks(o)
            elif kind == ACK and o.state is State.SENDING:
                self._end(o, State.DONE, [])
                if o.free_source:
                    self.pools.alloc.free(request_id)
            elif kind in (NACK, ABORT):
                final = State.REFUSED if o.state is State.OFFERED else State.ABORTED
                self._end(o, final, reasons_of(header))
        return len(msgs)

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """End the attempt here (cancel, timeout): drop the pins, tell the receiver."""
        o = self._offers.get(request_id)
        if o is None or o.state.final:
            return
        self._end(o, State.ABORTED, [reason])
        ch = channels(request_id).to_receiver
        self.transport.abort(ch)  # chunks still in flight are void
        self.transport.send(ch, {"type": ABORT, "epoch": o.epoch, "reasons": [reason]})

    def crash(self) -> None:
        """Lose everything (a process crash): attempts forgotten, pools reset."""
        self._offers.clear()
        self.pools.reset()

    # ------------------------------------------------------------ internals
    def _send_chunks(self, o: _Offer) -> None:
        ch = channels(o.request_id).to_receiver
        for r, snap in zip(self.pools.primaries, o.snaps, strict=True):
            o.chunks += send_chunks(self.transport, ch, snap, rank=r)
            o.bytes_sent += sum(len(p) for p in snap.payloads)
        o.state = State.SENDING

    def _end(self, o: _Offer, state: State, reasons: list[str]) -> None:
        for r, snap in zip(self.pools.primaries, o.snaps, strict=False):  # none if streamed
            release(self.pools.pools[r], snap)
        o.snaps, o.state, o.reasons = [], state, reasons
