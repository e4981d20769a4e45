"""One chunk of a live attempt, checked and installed (the receiver's only install;
``ChunkIntake``: the ``Receiver``'s chunk handling, this attempt's or fenced).

A whole-block chunk (``install_block``) or one (rank, layer) of a streamed offer, that
layer of every sent block (``install_layer``): rank and block index (or layer and sent
blocks) from the header (else ``ChunkError``, RankAgreement for an unknown rank), the
payload size, xxh3 of the bytes == the header's checksum (else ``ChecksumError`` naming
block and rank), a canonical block against the manifest's checksum, and only then is the
chunk counted. Where the chunk lands as it is (the same block on both sides, CPU,
contiguous pieces: ``copy_hashed``), it is copied into its reserved target blocks and
hashed there, piece by piece while each is in cache: one read of the payload, as a
registered-memory WRITE lands before its completion is checked. Reserved blocks are
not the engine's to read (a layer is ready, the request's blocks owned, only once every
chunk of it is counted), and a chunk that fails its check ends the attempt, which gives
back every block it reserved: its bytes are never read. Elsewhere (resharded, permuted,
staged, on a device) the payload is hashed first, then written. Each raises the refusal
and counts nothing; the ``Receiver`` ends the attempt on it. A duplicate (or a run
overlapping a landed one) is refused before any byte of it is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from refimpl.api import wire
from refimpl.api.intake import Attempt, send_quietly
from refimpl.api.layers import land_layer_blocks, land_shard
from refimpl.api.layers import pool_geometry as _pool_geometry
from refimpl.api.switches import LAYER_READY_ON_STAGING
from refimpl.api.wire import NACK, channels
from refimpl.checksum import bytes_checksum
from refimpl.errors import ChecksumError, ChunkError, OwnershipError
from refimpl.memory.views import Landing, copy_hashed, landing, scatter_layer
from refimpl.pool import PoolGeometry
from refimpl.rankpools import RankPools
from refimpl.transport import Payload, Transport
from spec import shardmap as sm
from spec.manifest import Manifest

HASH_AS_LANDED = True  # False: hash each chunk, then copy it (the old order; benchmarks)


def _kv(pool: Any) -> Any:
    try:
        return pool.kv
    except TypeError:  # registered per-layer caches: no one tensor of whole blocks
        return None


def where(a: Attempt, header: Mapping[str, Any]) -> tuple[int, int]:
    """A chunk's (source rank, block index), or ChunkError naming what is wrong."""
    rank, idx = header.get("rank"), header.get("block_index")
    if type(rank) is not int or rank not in a.ranks:
        raise ChunkError(f"chunk of rank {rank!r}; senders {a.ranks}", prop="RankAgreement")
    if type(idx) is not int or idx not in a.m.sent_blocks:
        raise ChunkError(f"block_index {idx!r} not in sent blocks {a.m.sent_blocks}")
    return rank, idx


def _sized(payload: Payload, want: int, what: str) -> None:
    if not isinstance(payload, bytes | bytearray | memoryview) or len(payload) != want:
        n = len(payload) if isinstance(payload, bytes | bytearray | memoryview) else payload
        raise ChunkError(f"{what}: {n!r:.40} bytes, expected {want}")


def _against(header: Mapping[str, Any], actual: str, what: str, landed: bool = False) -> str:
    if actual != header.get("checksum"):
        where = " as they landed (in reserved blocks, not counted)" if landed else ""
        raise ChecksumError(
            f"{what}: bytes{where} do not hash to the header's checksum "
            f"({actual} != {header.get('checksum')!r:.40})"
        )
    return actual


def check_chunk(header: Mapping[str, Any], payload: Payload, what: str) -> str:
    """The xxh3-64 of a chunk's bytes (``refimpl.checksum``, the one convention), which
    must be its header's ``checksum`` (else ``ChecksumError`` naming ``what``): the check
    of a chunk hashed before it is written (here, and the reference engine's decode)."""
    return _against(header, bytes_checksum(payload), what)


def check_blocks(
    pools: RankPools, blocks: Sequence[int], m: Manifest, indices: Sequence[int]
) -> int:
    """End to end: each of ``blocks`` (this side's ids of the manifest's block
    ``indices``), reassembled from every rank as one heads_major block, hashes to the
    manifest's checksum (else ``ChecksumError`` naming the block); returns how many
    passed. The ``Receiver``'s last check before its commit, and the reference engine's
    ``DecodeValidate``'s."""
    for i, got in zip(indices, pools.checksums(list(blocks)), strict=True):
        want = m.block_checksums[i - m.prefix_blocks]
        if got != want:
            raise ChecksumError(
                f"block {i}: bytes hash to {got}, not the manifest's checksum {want}"
            )
    return len(indices)


def chunk_intact(header: Mapping[str, Any], payload: Payload) -> bool:
    """``check_chunk`` as a yes or no (the reference engine names a chunk that fails it
    ``ChunkCorrupt``, and installs nothing of it)."""
    try:
        check_chunk(header, payload, "chunk")
    except ChecksumError:
        return False
    return True


def _landing(a: Attempt, pools: RankPools, rank: int, layer: int) -> Landing | None:
    """Where source rank ``rank``'s chunks of ``layer`` (-1: whole blocks) are copied as
    they are and hashed as they landed (``copy_hashed``): the same block on both sides,
    one destination rank, contiguous pieces on CPU; else None (the chunk is hashed, then
    written: resharded, permuted, staged or on a device). Kept per attempt."""
    if not HASH_AS_LANDED or a.staging is not None:
        return None
    pieces, key = a.pieces[rank], (rank, layer)
    if key not in a.spans:
        whole, view = slice(0, pools.geometry.kv_heads), None
        same = len(pieces) == 1 and _src_pool(a) == pools.geometry
        if same and pieces[0].src_slice == pieces[0].dst_slice == whole:
            pool = pools.pools[pieces[0].dst_rank]
            view = _kv(pool) if layer < 0 else pool.layer(layer)
        a.spans[key] = None if view is None else landing(view)
    return a.spans[key]


def _src_pool(a: Attempt) -> PoolGeometry:
    """The sender's per-rank block geometry, made once per attempt (not per chunk)."""
    if a.src_pool is None:
        a.src_pool = _pool_geometry(a.src)
    return a.src_pool


def install_block(
    pools: RankPools, a: Attempt, header: Mapping[str, Any], payload: Payload
) -> None:
    """One whole block of one source rank."""
    m = a.m
    rank, idx = where(a, header)
    if (rank, idx) in a.landed:
        a.duplicates += 1
        return
    src, what = _src_pool(a), f"block {idx} (rank {rank})"
    canonical = m.src_tp == 1 and m.layout == sm.LAYOUTS[0]
    j, rid = idx - m.prefix_blocks, m.request_id  # j: index among the sent blocks
    b = a.target[a.prefix + j] if a.staging is None else -1
    span = _landing(a, pools, rank, -1)
    _sized(payload, src.block_bytes, what)
    if span is not None:  # copied into the reserved block, hashed there, then counted
        pools.alloc.check_write(rid, [b])
        actual = _against(header, copy_hashed(span, [b], payload), what, landed=True)
    else:
        actual = check_chunk(header, payload, what)
    expected = m.block_checksums[idx - m.prefix_blocks]
    if canonical and actual != expected:
        raise ChecksumError(
            f"block {idx}: bytes hash to {actual}, not the manifest's checksum {expected}"
        )
    if a.staging is not None:
        a.staging.pools[rank].write_block_bytes(rid, a.staging.alloc.blocks_of(rid)[j], payload)
    elif span is None:
        pools.alloc.check_write(rid, [b])
        land_shard(pools, a.pieces[rank], src, payload, b)
    a.landed.add((rank, idx))  # counted only once the install returned
    a.checks += 1
    if canonical and a.staging is None and len(a.pieces[rank]) == 1:
        a.verified.add(idx)  # verified bytes, copied whole: no need to hash again


def install_layer(
    pools: RankPools, a: Attempt, header: Mapping[str, Any], payload: Payload
) -> int | None:
    """One (rank, layer) of a streamed offer for a run of sent blocks (``block_index`` and
    the ``blocks`` after it; every sent block unless the sender splits its layers): their
    layer pieces in block order. Returns the layer (None: a duplicate). Rank, layer, run
    and size are checked before any byte is written, the checksum before it is counted."""
    m, s = a.m, a.stream
    assert s is not None
    rank, idx = where(a, header)
    layer, count, j0 = (
        s.check_layer(header.get("layer")),
        header.get("blocks"),
        idx - m.prefix_blocks,
    )
    if type(count) is not int or not 1 <= count <= len(m.sent_blocks) - j0:
        raise ChunkError(
            f"layer {layer} (rank {rank}): {count!r:.20} blocks from block {idx}, "
            f"{len(m.sent_blocks) - j0} sent from there"
        )
    seen = s.landed.seen(rank, layer, j0, count)
    if seen == count:
        a.duplicates += 1
        return None
    if seen:
        raise ChunkError(f"layer {layer} (rank {rank}): blocks {idx}+{count} overlap a landed run")
    src = _src_pool(a)
    what = f"layer {layer} (rank {rank}) of blocks {idx}+{count}"
    _sized(payload, src.block_bytes // m.num_layers * count, what)
    rid, view = m.request_id, memoryview(payload).cast("B")
    targets = a.target[a.prefix + j0 : a.prefix + j0 + count]
    span = _landing(a, pools, rank, layer)
    if span is not None:  # copied into the reserved blocks, hashed there, then counted
        pools.alloc.check_write(rid, targets)
        checksum = _against(header, copy_hashed(span, targets, view), what, landed=True)
    else:
        checksum = check_chunk(header, view, what)
    if a.staging is not None:
        staged = a.staging.alloc.blocks_of(rid)[j0 : j0 + count]
        a.staging.alloc.check_write(rid, staged)
        scatter_layer(a.staging.pools[rank].layer(layer), staged, view)  # own layout
    elif span is None:
        pools.alloc.check_write(rid, targets)
        land_layer_blocks(pools, a.pieces[rank], src, view, targets, layer)
    s.landed_chunk(rank, j0, count, layer, checksum)  # counted once installed
    a.checks += 1
    return layer


class ChunkIntake:
    """A ``Receiver``'s chunks of a live attempt (a mixin): this attempt's (else fenced
    and counted, or the ranks' disagreement refused by name), installed, and unstaged
    layer by layer once a whole layer is in staging."""

    pools: RankPools
    transport: Transport
    stage: bool
    mutants: frozenset[str]
    inc: wire.Incarnations

    def _fail(self, a: Attempt, err: OwnershipError) -> None:
        raise NotImplementedError  # ``Receiver._fail``

    def _unstage(self, a: Attempt, layers: Sequence[int]) -> None:
        raise NotImplementedError  # ``Receiver._unstage``

    def _on_chunk(self, a: Attempt, header: Mapping[str, Any], payload: Payload) -> None:
        if not self._ours(a, header):
            return
        try:
            if a.stream is None:
                install_block(self.pools, a, header, payload)
            elif (layer := install_layer(self.pools, a, header, payload)) is not None:
                staged = a.staging is not None and not self.stage
                if staged and a.stream.layer_ready(layer):  # the whole layer is in staging:
                    if LAYER_READY_ON_STAGING not in self.mutants:  # (the bug leaves it there)
                        self._unstage(a, [layer])  # into the target blocks, now
        except OwnershipError as err:
            self._fail(a, err)

    def _ours(self, a: Attempt, header: Mapping[str, Any]) -> bool:
        """This attempt's message, else counted as stale (fenced, changes nothing). A
        source rank speaking of a newer epoch than the attempt's means the ranks
        disagree on the attempt: refused by name (``RankAgreement``), never a stall."""
        e = wire.epoch_of(header)
        if header.get("request_id") == a.m.request_id and e == a.m.epoch:
            return True
        a.stale += 1
        rank = header.get("rank")
        if a.ranked and e is not None and e > a.m.epoch and type(rank) is int and rank in a.ranks:
            why = (
                f"rank {rank} sends epoch {e} of {a.m.request_id!r}, but the attempt "
                f"(rank 0's manifest) is epoch {a.m.epoch}: the ranks disagree"
            )
            send_quietly(
                self.transport,
                channels(a.m.request_id).to_rank(rank),
                wire.stamp(
                    {"type": NACK, "epoch": e, "reasons": [f"[RankAgreement] {why}"]}, self.inc.own
                ),
            )
            self._fail(a, ChunkError(why, prop="RankAgreement"))
        return False

    def _complete(self, a: Attempt) -> bool:
        if a.stream is not None:
            return a.stream.complete()
        return len(a.landed) == len(a.ranks) * len(a.m.sent_blocks)
