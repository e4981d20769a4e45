"""The sender's half of the whole-block data path, under ``refimpl.api.Sender``: freeze a
snapshot (``freeze``: pinned, read-only, one xxh3-64 per block), build its manifest
(``build_manifest``: the one manifest builder, its checksums by ``manifest_checksums``:
the one convention), send it block by block (``send_chunks``),
release it (``release``).

``freeze`` pins the source blocks (``allocator.incref`` under the holder ``pin_name``), so
they are read-only and outlive a ``free`` by the request until ``release``; the payloads
are zero-copy byte views of those blocks on CPU (one staged D2H copy on CUDA), each with
its xxh3-64. A chunk header carries request_id, epoch, block index, rank and checksum.

The receiving end is ``refimpl.api.Receiver`` (the one receive path: the manifest gate,
the reservation, each chunk verified, then installed, then counted, the commit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from refimpl.checksum import bytes_checksum
from refimpl.errors import ChunkError
from refimpl.memory.interface import BlockMemory
from refimpl.transport import Transport
from spec.manifest import MANIFEST_VERSION, LocalConfig, Manifest

CHUNK = "chunk"  # a chunk message's type (``refimpl.api.wire`` names it from here)


def pin_name(request_id: str, epoch: int) -> str:
    """The allocator holder through which a handoff attempt pins its source blocks."""
    return f"{request_id}@pin{epoch}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One attempt's frozen source: per sent block, its bytes and their checksum."""

    request_id: str
    epoch: int
    block_ids: tuple[int, ...]  # source block ids of the sent blocks, in logical order
    first_block: int  # logical index of block_ids[0]; the receiver holds the blocks before
    checksums: tuple[str, ...]  # xxh3-64 hex per sent block
    payloads: tuple[memoryview, ...]  # read-only bytes per block; alias the pinned blocks

    @property
    def pin(self) -> str:
        return pin_name(self.request_id, self.epoch)


def freeze(
    pool: BlockMemory,
    request_id: str,
    epoch: int,
    *,
    first_block: int = 0,
    checksums: Sequence[str] | None = None,
    blocks: Sequence[int] | None = None,
) -> Snapshot:
    """Pin ``request_id``'s blocks from ``first_block`` on, and checksum their bytes.

    ``blocks``: the source block ids to send (logical blocks ``first_block`` on), when the
    request holds more than it sends (room reserved for decoding); default: every block
    it holds from ``first_block`` on. Each must be held by ``request_id``.

    ``checksums``: the writer's own per-block checksums, computed when it wrote the
    blocks (a real engine does it in the kernel that fills a block), so that freezing
    does not read the whole KV again. They are not trusted further than that: the
    receiver hashes every chunk before counting it, so a stale one fails the transfer
    (``ChecksumError``, every reserved block given back): wrong bytes are never read.
    """
    held = pool.allocator.blocks_of(request_id)
    if blocks is None:
        blocks = held[first_block:]
    elif not_held := sorted(set(blocks) - set(held)):
        raise ChunkError(f"blocks {not_held} to freeze are not held by {request_id!r}")
    blocks = tuple(blocks)
    if checksums is not None and len(checksums) != len(blocks):
        raise ChunkError(f"{len(checksums)} checksums for {len(blocks)} blocks to freeze")
    pool.allocator.incref(pin_name(request_id, epoch), blocks)  # refuses partial replicas
    payloads = tuple(pool.host_bytes(blocks))
    sums = tuple(checksums) if checksums is not None else tuple(map(bytes_checksum, payloads))
    return Snapshot(request_id, epoch, blocks, first_block, sums, payloads)


def release(pool: BlockMemory, snap: Snapshot) -> list[int]:
    """Drop the snapshot's pin; returns the source blocks that became free."""
    return pool.allocator.decref(snap.pin, snap.block_ids)


class CanonicalSource(Protocol):
    """Pools that can say whether one rank's block is the canonical block, and hash the
    canonical blocks otherwise (``refimpl.engine.data.RankPools``)."""

    @property
    def canonical(self) -> bool: ...

    def checksums(self, block_ids: Sequence[int]) -> list[str]: ...


def manifest_checksums(
    pools: CanonicalSource, blocks: Sequence[int], rank_sums: Sequence[str]
) -> tuple[str, ...]:
    """The manifest's checksum of each of ``blocks``: the xxh3-64 of the whole canonical
    block (every head, heads_major), the one convention of every sender. ``rank_sums``
    are one rank's per-block checksums: when that rank's block is the canonical block
    (``pools.canonical``) they are the manifest's, and nothing is hashed again."""
    if pools.canonical:
        return tuple(rank_sums)
    return tuple(pools.checksums(list(blocks)))


def build_manifest(
    snap: Snapshot,
    source: LocalConfig,
    *,
    token_ids: Sequence[int],
    dst_tp: int,
    dst_cp: int,
    start_pos: int = 0,
) -> Manifest:
    """The manifest of a snapshot taken on a worker running ``source``."""
    return Manifest(
        request_id=snap.request_id,
        model_id=source.model_id,
        adapter_id=source.adapter_id,
        token_ids=tuple(token_ids),
        num_tokens=len(token_ids),
        cache_fields=source.cache_fields,
        num_layers=source.num_layers,
        dtype=source.dtype,
        quantization=source.quantization,
        kv_heads=source.kv_heads,
        head_dim=source.head_dim,
        block_size=source.block_size,
        layout=source.layout,
        start_pos=start_pos,
        rope=source.rope,
        src_tp=source.tp,
        src_cp=source.cp,
        dst_tp=dst_tp,
        dst_cp=dst_cp,
        prefix_blocks=snap.first_block,
        block_checksums=snap.checksums,
        version=MANIFEST_VERSION,
        epoch=snap.epoch,
        kv_scales=source.kv_scales,
    )


def send_chunks(
    transport: Transport,
    channel: str,
    snap: Snapshot,
    *,
    rank: int = 0,
    is_cancelled: Callable[[], bool] | None = None,
    inc: int = 0,
) -> int:
    """Send one chunk per block, stopping early once cancelled; returns the number sent.
    ``inc``: the incarnation of the receiver's registration the writes target (0: left
    out of the header)."""
    sent = 0
    for j, (payload, checksum) in enumerate(zip(snap.payloads, snap.checksums, strict=True)):
        if is_cancelled is not None and is_cancelled():
            break
        header = {
            "type": CHUNK,
            "request_id": snap.request_id,
            "epoch": snap.epoch,
            "block_index": snap.first_block + j,
            "rank": rank,
            "checksum": checksum,
        }
        if inc:
            header["inc"] = inc
        transport.send(channel, header, payload)
        sent += 1
    return sent


__all__ = [
    "CHUNK",
    "CanonicalSource",
    "Snapshot",
    "build_manifest",
    "freeze",
    "manifest_checksums",
    "pin_name",
    "release",
    "send_chunks",
]
