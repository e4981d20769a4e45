"""A streamed offer's sender side: each layer copied at ``send_layer``, sent on ready
(``LayerOffers``: the ``Sender``'s streamed ``offer`` and ``send_layer``; ``Stream``: one
attempt's layers, copies and chunk checksums).

``Sender.send_layer(rid, layer)`` copies that layer of every sent block of every source
rank held here into one buffer per rank (the blocks' layer pieces in block order: one
message per (rank, layer), not per block; ``Sender(..., blocks_per_chunk=k)`` splits it
into runs of k blocks, as the spec's tour does with k=1: one spec chunk per block), and
hashes each chunk (xxh3-64, ``refimpl.checksum``) piece by piece as it is copied, while
the piece is in cache: each byte is read once for the copy and once, from cache, for
the hash. What leaves is the bytes at ``send_layer``, so the request may free or reuse
its blocks as soon as it returned (FrozenSnapshot / NoReuseUnderIO for a streamed offer,
whose blocks are not pinned). Copies of layers computed before the receiver's ready wait
here (one layer's bytes per rank and block, at most all of them) and are dropped when
the attempt ends. After the last layer, one ``seal`` per rank lists every chunk it sent
(``[layer, block_index, blocks, checksum]``): the receiver commits only if the chunks
it installed are exactly those (``refimpl.api.layers``).

The ``stream_reads_at_ready`` switch (``refimpl.api.switches``) is the bug this fixes: a
layer's bytes are read when they are sent, not when ``send_layer`` was called.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from refimpl.api.geometry import KVGeometry
from refimpl.api.switches import STREAM_READS_AT_READY
from refimpl.api.wire import CHUNK, MANIFEST, SEAL, Incarnations, State, channels, stamp
from refimpl.checksum import byte_view, bytes_checksum, hasher, writable_byte_view
from refimpl.chunks import Snapshot, build_manifest
from refimpl.errors import ChunkError
from refimpl.memory.views import gather_into, gather_layer, landing, piece_bytes
from refimpl.rankpools import RankPools
from refimpl.transport import Transport
from spec.manifest import LocalConfig, Manifest

GROUP_BYTES = 1 << 19  # bytes gathered at a time, then hashed from cache (L2: 1 MiB a core)


class Buffers:
    """A Sender's host buffers for layer copies, reused: a fresh buffer costs a page fault
    per page on first touch (on this machine a fresh 256 MiB costs more than 10 copies
    of it), as an engine's registered staging memory does not. A buffer comes back only
    from an attempt the receiver acknowledged (every byte of it consumed, on any
    transport); an attempt that ended otherwise drops its buffers (a chunk may still be
    on its way). At most ``max_bytes`` are kept."""

    def __init__(self, max_bytes: int = 1 << 29) -> None:
        self.max_bytes, self.kept = max_bytes, 0
        self._free: dict[int, list[torch.Tensor]] = {}

    def take(self, nbytes: int) -> torch.Tensor:
        free = self._free.get(nbytes)
        if free:
            self.kept -= nbytes
            return free.pop()
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, bufs: Sequence[torch.Tensor]) -> None:
        for t in bufs:
            if self.kept + t.numel() <= self.max_bytes:
                self._free.setdefault(t.numel(), []).append(t)
                self.kept += t.numel()


@dataclass
class Stream:
    """Layers computed, layers sent, each rank's chunks (for its seal), the copies to send."""

    layers: int
    blocks: tuple[int, ...]  # the sent blocks' ids here
    computed: int = 0  # layers [0, computed) are written and may be sent
    sent: int = 0  # layers [0, sent) are on the wire
    copied: int = 0  # layers whose bytes were copied here (at send_layer, or by the bug later)
    sums: dict[int, list[tuple[int, int, int, str]]] = field(default_factory=dict)  # rank ->
    # its chunks as the seal lists them: (layer, j, blocks, xxh3), j among the sent blocks
    sealed: bool = False
    copies: deque[tuple[int, int, int, memoryview, str]] = field(default_factory=deque)  # to
    # send: (layer, rank, j, the layer of sent blocks j.. at send_layer, its xxh3), oldest first
    run: int | None = None  # sent blocks per chunk (None: every sent block in one chunk)
    buffers: Buffers = field(default_factory=Buffers)
    taken: list[torch.Tensor] = field(default_factory=list)  # from ``buffers``, this attempt
    room: dict[int, torch.Tensor] = field(default_factory=dict)  # rank -> all its layers' copies

    def end(self, acked: bool) -> None:
        """The attempt ended: drop the copies not sent; their buffers go back if acked."""
        self.copies.clear()
        self.room.clear()
        if acked:
            self.buffers.give(self.taken)
        self.taken.clear()

    def copy_layer(self, pools: RankPools, ranks: Sequence[tuple[int, int]], layer: int) -> None:
        """Copy layer ``layer`` of every sent block of each (source rank, pool index) into
        one buffer per rank, and checksum each chunk of it as it is copied (a group of
        blocks gathered, then hashed while it is in cache: ``GROUP_BYTES``)."""
        if not self.blocks:
            return  # nothing sent (a prefix covers every block): no chunk, only the seals
        n = len(self.blocks)
        idx = torch.as_tensor(self.blocks, dtype=torch.long)
        run = self.run or n
        for r, pool in ranks:
            lv = pools.pools[pool].layer(layer)  # this layer of every block (a view)
            per = piece_bytes(lv)
            if lv.device.type == "cpu":
                room = self._room(r, n * per)
                t = room[layer * n * per : (layer + 1) * n * per]
                out, payload = t.view(n, per), byte_view(t)  # the copy, kept until the end
                span = landing(lv)  # each block's piece contiguous: copied as raw bytes
                into = None if span is None else writable_byte_view(t)
                step = max(1, GROUP_BYTES // max(1, per))
                for j in range(0, n, run):
                    h, end = hasher(), min(n, j + run)
                    for k in range(j, end, step):
                        e = min(end, k + step)
                        if span is not None and into is not None:
                            gather_into(span, self.blocks[k:e], into[k * per : e * per])
                        else:
                            gather_layer(lv, idx[k:e], out=out[k:e])
                        h.update(payload[k * per : e * per])
                    self._chunk(layer, r, j, payload[j * per : end * per], h.hexdigest(), end - j)
            else:
                payload = byte_view(gather_layer(lv, idx).cpu())
                for j in range(0, n, run):
                    piece = payload[j * per : min(n, j + run) * per]
                    self._chunk(layer, r, j, piece, bytes_checksum(piece), min(run, n - j))
        self.copied += 1

    def _room(self, r: int, layer_bytes: int) -> torch.Tensor:
        """Rank ``r``'s buffer for every layer of this attempt, layer after layer (taken
        at its first layer): its chunks lie side by side, so a transport that gathers
        them sends them uncopied (``refimpl.transport_dist``)."""
        if r not in self.room:
            self.room[r] = self.buffers.take(self.layers * layer_bytes)
            self.taken.append(self.room[r])
        return self.room[r]

    def _chunk(
        self, layer: int, r: int, j: int, piece: memoryview, checksum: str, blocks: int
    ) -> None:
        """One chunk copied: queued to send, and listed for its rank's seal."""
        self.copies.append((layer, r, j, piece, checksum))
        self.sums.setdefault(r, []).append((layer, j, blocks, checksum))

    def flush(
        self,
        transport: Transport,
        channel: str,
        head: dict[str, Any],
        first_block: int,
        ranks: Sequence[int],
        read_now: Any = None,
        seal_head: dict[str, Any] | None = None,
    ) -> tuple[int, int]:
        """Send every computed layer not sent yet, then the seals once all are out;
        returns (chunks, payload bytes) sent. ``read_now(layer)``: the bug switch's read
        of a layer at this point (None: the copies taken at send_layer). ``seal_head``:
        the seals' head, when not ``head`` (a seal is the sender's own message, a chunk a
        write stamped with its target's incarnation)."""
        n = nbytes = 0
        while self.sent < self.computed:
            if read_now is not None:
                read_now(self.sent)
            while self.copies and self.copies[0][0] == self.sent:
                layer, r, j, payload, checksum = self.copies.popleft()
                run = min(self.run or len(self.blocks), len(self.blocks) - j)
                header = {
                    **head,
                    "type": CHUNK,
                    "block_index": first_block + j,  # the first of the chunk's ``blocks``
                    "blocks": run,
                    "rank": r,
                    "layer": layer,
                    "checksum": checksum,
                }
                transport.send(channel, header, payload)
                n, nbytes = n + 1, nbytes + payload.nbytes
            self.sent += 1
        if self.sent == self.layers and not self.sealed:
            self.sealed = True
            for r in ranks:
                sums = [[layer, first_block + j, k, c] for layer, j, k, c in self.sums.get(r, [])]
                seal = {**(head if seal_head is None else seal_head), "type": SEAL, "rank": r}
                transport.send(channel, {**seal, "chunks": sums})
        return n, nbytes


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
    stream: Stream | None = None
    rinc: int = 0  # the incarnation of the receiver whose Ready it took: its writes' target
    nacked: tuple[State, list[str], int] | None = None  # a nack read while its writes were
    # pending: (the end it gives, its reasons, its sender's incarnation); ``api.unrevocable.ends``
    aborting: list[str] | None = None  # an abort waiting for its writes (its reasons)
    told: State | None = None  # a sibling rank's abort: the end it gives (then Quiesced)


class LayerOffers:
    """A ``Sender``'s streamed offers (a mixin): ``offer(..., layers=L)``, ``send_layer``,
    and the flush of the computed layers once the receiver is ready."""

    geometry: KVGeometry
    pools: RankPools
    transport: Transport
    local: LocalConfig
    rank: int | None
    ranks: list[int]
    mutants: frozenset[str]
    blocks_per_chunk: int | None
    _offers: dict[str, _Offer]
    _pool_of: dict[int, int]
    _buffers: Buffers
    inc: Incarnations

    def _offer_stream(
        self,
        rinc: int,
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
        zeros = ("0" * 16,) * len(sent)  # the seals list the chunks: the KV is not there yet
        snap = Snapshot(rid, epoch, tuple(sent), prefix_blocks, zeros, ())
        m = build_manifest(snap, self.local, token_ids=token_ids, dst_tp=dst_tp, dst_cp=dst_cp)
        st = Stream(layers, tuple(sent), run=self.blocks_per_chunk, buffers=self._buffers)
        o = _Offer(rid, epoch, m, [], free_source, stream=st, rinc=rinc)
        self._offers[rid] = o
        if self.rank is None or self.rank == 0:  # rank 0 (always a primary) leads
            header = {"type": MANIFEST, "epoch": epoch, "manifest": m.to_json_dict()}
            header["layers"] = layers
            stamp(header, self.inc.own)
            if self.rank is not None:
                header["ranked"] = True
            try:
                self.transport.send(channels(rid).to_receiver, header)
            except Exception:
                del self._offers[rid]
                raise
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
        if not_held := sorted(set(o.stream.blocks) - set(self.pools.alloc.blocks_of(request_id))):
            raise ChunkError(
                f"{request_id!r}: send_layer({layer}): blocks {not_held} are not held by it "
                "(a layer is copied at send_layer: free the blocks only after it returned)"
            )
        if STREAM_READS_AT_READY not in self.mutants:
            o.stream.copy_layer(self.pools, self._ranks(), layer)
        o.stream.computed += 1
        return self._flush(o) if o.state is State.SENDING else 0

    def _ranks(self) -> list[tuple[int, int]]:
        return [(r, self._pool_of[r]) for r in self.ranks]

    def _flush(self, o: _Offer) -> int:
        """Send every computed layer not sent yet, then the seals once all are out."""
        st = o.stream
        assert st is not None
        read_now = None
        if STREAM_READS_AT_READY in self.mutants:  # the bug: the bytes there now

            def read_now(layer: int) -> None:
                st.copy_layer(self.pools, self._ranks(), layer)

        head = {"request_id": o.request_id, "epoch": o.epoch}
        seal = stamp(dict(head), self.inc.own)  # the sender's; its writes the target's
        ch, first = channels(o.request_id).to_receiver, o.manifest.prefix_blocks
        stamp(head, o.rinc)
        n, nbytes = st.flush(self.transport, ch, head, first, self.ranks, read_now, seal)
        o.chunks, o.bytes_sent = o.chunks + n, o.bytes_sent + nbytes
        return n
