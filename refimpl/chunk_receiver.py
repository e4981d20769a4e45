"""The receiving end of the chunked data path: verify each chunk, install it, then count it.

``ChunkReceiver`` installs one attempt's chunks into its reserved destination blocks (see
``refimpl.chunks`` for the whole path). It refuses at construction a manifest whose
blocks the pool cannot hold (only the axis order may differ), counts a block as
installed only once its install returned, remembers corrupt chunks so that ``commit``
names them (``ChecksumError``), and ``abort`` gives the reserved blocks back to the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from refimpl.checksum import bytes_checksum
from refimpl.errors import (
    CancelledError,
    ChecksumError,
    ChunkError,
    IncompleteError,
    InUseError,
    StaleError,
)
from refimpl.pool import KVPool, PoolGeometry
from refimpl.transport import Payload, Transport, epoch_of
from spec.manifest import Manifest

CHUNK = "chunk"
_INSTALLER: list[ThreadPoolExecutor] = []


def _installer() -> ThreadPoolExecutor:
    """One shared thread that performs installs (copies) behind the verifier."""
    if not _INSTALLER:
        _INSTALLER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-install"))
    return _INSTALLER[0]


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
        src, g = PoolGeometry.of_manifest(m), pool.geometry
        if replace(src, layout=g.layout) != g:  # checked before anything is installed
            raise ChunkError(
                f"the manifest's blocks {src} cannot be installed into pool blocks {g} "
                "(only the axis order may differ); reshard through a staging pool"
            )
        self.pool, self.manifest, self.rank = pool, m, rank
        self.src_geometry = src
        self.dest = {m.prefix_blocks + j: b for j, b in enumerate(dest_blocks)}
        self.installed: set[int] = set()  # blocks whose install returned
        self.corrupt: set[int] = set()  # blocks refused for their bytes or checksum
        self._pending: set[int] = set()  # verified, install not yet returned
        self.cancelled = False

    @property
    def complete(self) -> bool:
        return len(self.installed) == len(self.dest)

    def missing(self) -> list[int]:
        return sorted(self.dest.keys() - self.installed)

    def cancel(self) -> None:
        """Sticky: no chunk is installed and no commit happens after this."""
        self.cancelled = True

    def abort(self) -> list[int]:
        """Cancel and give the reserved destination blocks back to the pool.

        Every install has returned by now (``pump`` joins its installs), so the blocks
        pass through quarantine straight to the free list. Like ``quarantine``, this also
        drops any other reference the request holds in this pool. Returns the freed ids.
        """
        self.cancel()
        m, alloc = self.manifest, self.pool.allocator
        alloc.quarantine(m.request_id)
        return alloc.unquarantine_and_free(m.request_id, m.epoch)

    def receive(self, header: Mapping[str, Any], payload: Payload) -> bool:
        """Verify and install one chunk; False for a duplicate of an installed block."""
        idx = self._verify(header, payload)
        if idx is None:
            return False
        try:
            self._install_and_mark(idx, payload)
        finally:
            self._pending.discard(idx)
        return True

    def _verify(self, header: Mapping[str, Any], payload: Payload) -> int | None:
        """Every check of one chunk, its bytes hashed; the block index to install, or
        None for a duplicate. The caller installs it; only the install marks it."""
        m = self.manifest
        if self.cancelled:
            raise CancelledError(f"{m.request_id!r} epoch {m.epoch} is cancelled")
        idx, checksum = header.get("block_index"), header.get("checksum")
        if header.get("request_id") != m.request_id or epoch_of(header) != m.epoch:
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
            self.corrupt.add(idx)
            raise ChecksumError(
                f"block {idx}: header checksum {checksum!r} != manifest {expected!r}"
            )
        if idx in self.installed or idx in self._pending:
            return None
        actual = bytes_checksum(payload)
        if actual != expected:
            self.corrupt.add(idx)
            raise ChecksumError(f"block {idx}: bytes hash to {actual}, advertised {expected}")
        self._pending.add(idx)
        return idx

    def _install_and_mark(self, idx: int, payload: Payload) -> None:
        m = self.manifest
        self.pool.write_block_bytes(m.request_id, self.dest[idx], payload, self.src_geometry)
        self.installed.add(idx)  # only once the bytes are in the block

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
        installs: list[tuple[int, Future[None]]] = []
        try:
            for header, payload in transport.poll(channel):
                if not isinstance(header, dict):
                    report.malformed += 1  # not a header: ignored
                    continue
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
                        installs.append(
                            (idx, _installer().submit(self._install_and_mark, idx, payload))
                        )
                    else:
                        try:
                            self._install_and_mark(idx, payload)
                        finally:
                            self._pending.discard(idx)
                        report.installed.append(idx)
        finally:
            failed: BaseException | None = None
            for idx, f in installs:
                try:
                    f.result()
                except BaseException as e:  # re-raised below, once all are joined
                    failed = failed or e
                else:
                    report.installed.append(idx)
                finally:
                    self._pending.discard(idx)
            if failed is not None:
                raise failed
        return report

    def commit(self) -> list[int]:
        """Make the installed replica visible: RESERVED -> OWNED. Refused unless complete."""
        m = self.manifest
        if self.cancelled:
            raise CancelledError(f"commit of cancelled {m.request_id!r} epoch {m.epoch}")
        if bad := sorted(self.corrupt - self.installed):
            raise ChecksumError(
                f"{m.request_id!r} epoch {m.epoch}: blocks {bad} arrived corrupt (their bytes "
                "do not hash to the manifest's checksum) and were not installed"
            )
        if not self.complete:
            raise IncompleteError(
                f"{m.request_id!r} epoch {m.epoch}: blocks {self.missing()} not installed"
            )
        return self.pool.allocator.commit(m.request_id, m.epoch)
