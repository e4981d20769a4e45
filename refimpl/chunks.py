"""The chunked data path: freeze a snapshot, send it block by block, verify, install.

Sender                                      Receiver (blocks already reserved)
  snap = freeze(pool, req, epoch)             m, verdict = accept_manifest(hdr, local)
  send_manifest(t, ch, build_manifest(..))    rx = ChunkReceiver(pool, m, dest_blocks)
  send_chunks(t, ch, snap)                    rx.pump(t, ch, is_cancelled)  # verify+install
  ... commit acknowledged ...                 rx.commit()                   # RESERVED->OWNED
  release(pool, snap)

``freeze`` pins the source blocks (``allocator.incref`` under the holder ``pin_name``), so
they are read-only and outlive a ``free`` by the request until ``release``; the payloads
are zero-copy byte views of those blocks on CPU (one staged D2H copy on CUDA), each with
its xxh3-64. A chunk header carries request_id, epoch, block index, rank and checksum.

The receiver installs a chunk only when its request and epoch are this attempt's (else
``StaleError``, dropped by ``pump``), its checksum equals both the header's and the
manifest's (else ``ChecksumError``, nothing written), and the request is not cancelled
(checked between chunks; sticky). Install is one ``copy_`` from the payload into the
reserved block. Commit requires every sent block installed; zero sent blocks (a full
prefix hit) commits at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from refimpl.checksum import bytes_checksum
from refimpl.errors import (
    CancelledError,
    ChecksumError,
    ChunkError,
    IncompleteError,
    InUseError,
    ManifestError,
    StaleError,
)
from refimpl.pool import KVPool, PoolGeometry
from refimpl.transport import Payload, Transport
from spec.manifest import MANIFEST_VERSION, LocalConfig, Manifest, Verdict, check_compatible
from spec.manifest import ManifestError as SpecManifestError
from spec.manifest import from_json_dict as manifest_from_json_dict

CHUNK, MANIFEST = "chunk", "manifest"
_INSTALLER: list[ThreadPoolExecutor] = []


def _installer() -> ThreadPoolExecutor:
    """One shared thread that performs installs (copies) behind the verifier."""
    if not _INSTALLER:
        _INSTALLER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-install"))
    return _INSTALLER[0]


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
    pool: KVPool,
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
    receiver hashes every chunk before installing it, so a stale one fails the transfer
    (``ChecksumError``), it never installs wrong bytes.
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


def release(pool: KVPool, snap: Snapshot) -> list[int]:
    """Drop the snapshot's pin; returns the source blocks that became free."""
    return pool.allocator.decref(snap.pin, snap.block_ids)


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
    )


def send_manifest(transport: Transport, channel: str, m: Manifest) -> None:
    transport.send(channel, {"type": MANIFEST, "manifest": m.to_json_dict()})


def accept_manifest(header: Mapping[str, Any], local: LocalConfig) -> tuple[Manifest, Verdict]:
    """Parse an untrusted manifest message and apply the compatibility rule.

    Raises refimpl's ManifestError listing every reason (validation or compatibility).
    """
    try:
        m = manifest_from_json_dict(header.get("manifest"))
    except SpecManifestError as e:
        raise ManifestError.from_spec(e) from None
    verdict = check_compatible(m, local)
    if not verdict.ok:
        raise ManifestError(list(verdict.reasons))
    return m, verdict


def send_chunks(
    transport: Transport,
    channel: str,
    snap: Snapshot,
    *,
    rank: int = 0,
    is_cancelled: Callable[[], bool] | None = None,
) -> int:
    """Send one chunk per block, stopping early once cancelled; returns the number sent."""
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
        transport.send(channel, header, payload)
        sent += 1
    return sent


@dataclass
class PumpReport:
    """What one ``pump`` did with the messages it polled."""

    installed: list[int] = field(default_factory=list)  # logical block indices
    duplicates: int = 0
    stale: int = 0  # other request or epoch: fenced, dropped
    corrupt: list[int] = field(default_factory=list)  # refused block indices
    malformed: int = 0
    discarded: int = 0  # arrived after cancellation; not looked at
    other: list[dict[str, Any]] = field(default_factory=list)  # non-chunk headers


class ChunkReceiver:
    """Installs one attempt's chunks into its reserved destination blocks."""

    def __init__(
        self, pool: KVPool, manifest: Manifest, dest_blocks: Sequence[int], *, rank: int = 0
    ) -> None:
        m, alloc = manifest, pool.allocator
        if len(set(dest_blocks)) != len(dest_blocks) or len(dest_blocks) != len(m.sent_blocks):
            raise ChunkError(
                f"destination blocks {list(dest_blocks)} for {len(m.sent_blocks)} sent blocks"
            )
        for b in dest_blocks:
            if alloc.owner(b) != m.request_id or alloc.status(b).value != "reserved":
                raise InUseError(
                    f"block {b} is {alloc.status(b).value}, owner "
                    f"{alloc.owner(b)!r}: not reserved for {m.request_id!r}"
                )
            if alloc.epoch(b) != m.epoch:
                raise StaleError(
                    f"block {b} reserved by epoch {alloc.epoch(b)}, manifest epoch {m.epoch}"
                )
        self.pool, self.manifest, self.rank = pool, m, rank
        self.src_geometry = PoolGeometry.of_manifest(m)
        self.dest = {m.prefix_blocks + j: b for j, b in enumerate(dest_blocks)}
        self.installed: set[int] = set()
        self.cancelled = False

    @property
    def complete(self) -> bool:
        return len(self.installed) == len(self.dest)

    def missing(self) -> list[int]:
        return sorted(self.dest.keys() - self.installed)

    def cancel(self) -> None:
        """Sticky: no chunk is installed and no commit happens after this."""
        self.cancelled = True

    def receive(self, header: Mapping[str, Any], payload: Payload) -> bool:
        """Verify and install one chunk; False for a duplicate of an installed block."""
        idx = self._verify(header, payload)
        if idx is None:
            return False
        self._install(idx, payload)
        return True

    def _verify(self, header: Mapping[str, Any], payload: Payload) -> int | None:
        """Every check of one chunk, its bytes hashed; the block index to install, or
        None for a duplicate. Marks the block installed (the caller installs it)."""
        m = self.manifest
        if self.cancelled:
            raise CancelledError(f"{m.request_id!r} epoch {m.epoch} is cancelled")
        idx, checksum = header.get("block_index"), header.get("checksum")
        if header.get("request_id") != m.request_id or header.get("epoch") != m.epoch:
            raise StaleError(
                f"chunk of {header.get('request_id')!r} epoch "
                f"{header.get('epoch')!r}; expecting {m.request_id!r} {m.epoch}"
            )
        if header.get("rank") != self.rank:
            raise ChunkError(
                f"chunk of rank {header.get('rank')!r} at receiver rank {self.rank}",
                prop="RankAgreement",
            )
        if type(idx) is not int or idx not in self.dest:
            raise ChunkError(f"block_index {idx!r} not in sent blocks {m.sent_blocks}")
        expected = m.block_checksums[idx - m.prefix_blocks]
        if checksum != expected:
            raise ChecksumError(
                f"block {idx}: header checksum {checksum!r} != manifest {expected!r}"
            )
        if idx in self.installed:
            return None
        actual = bytes_checksum(payload)
        if actual != expected:
            raise ChecksumError(f"block {idx}: bytes hash to {actual}, advertised {expected}")
        self.installed.add(idx)
        return idx

    def _install(self, idx: int, payload: Payload) -> None:
        m = self.manifest
        self.pool.write_block_bytes(m.request_id, self.dest[idx], payload, self.src_geometry)

    def pump(
        self,
        transport: Transport,
        channel: str,
        is_cancelled: Callable[[], bool] | None = None,
        *,
        overlap: bool = True,
    ) -> PumpReport:
        """Poll once and handle every message, checking cancellation before each chunk.

        ``overlap``: install block k on a helper thread while block k+1 is verified here
        (the copy releases the GIL; xxh3 does not). A block is still installed only after
        its own checksum matched, and every install has finished when ``pump`` returns.
        """
        report = PumpReport()
        installs: list[Future[None]] = []
        try:
            for header, payload in transport.poll(channel):
                if header.get("type") != CHUNK:
                    report.other.append(header)
                    continue
                if not self.cancelled and is_cancelled is not None and is_cancelled():
                    self.cancel()
                if self.cancelled:
                    report.discarded += 1
                    continue
                try:
                    idx = self._verify(header, payload)
                except StaleError:
                    report.stale += 1
                except ChecksumError:
                    report.corrupt.append(header["block_index"])
                except ChunkError:
                    report.malformed += 1
                else:
                    if idx is None:
                        report.duplicates += 1
                    elif overlap:
                        installs.append(_installer().submit(self._install, idx, payload))
                        report.installed.append(idx)
                    else:
                        self._install(idx, payload)
                        report.installed.append(idx)
        finally:
            for f in installs:
                f.result()  # re-raises an install's error here
        return report

    def commit(self) -> list[int]:
        """Make the installed replica visible: RESERVED -> OWNED. Refused unless complete."""
        m = self.manifest
        if self.cancelled:
            raise CancelledError(f"commit of cancelled {m.request_id!r} epoch {m.epoch}")
        if not self.complete:
            raise IncompleteError(
                f"{m.request_id!r} epoch {m.epoch}: blocks {self.missing()} not installed"
            )
        return self.pool.allocator.commit(m.request_id, m.epoch)
