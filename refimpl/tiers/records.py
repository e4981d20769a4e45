"""What a ``DiskTier`` hands out: a store's published chunks (``Stored``), a verified
hit (``Loaded``), a miss with its reason (``Miss``), and a reader's open, pinned run of
chunk files (``Prefix`` of ``Chunk``); ``TierPathError`` for a folder that cannot be a
tier; ``file_manifest``: a manifest as canonical blocks; ``Pins``: a tier's readers.
The tier itself is ``refimpl.api.disk``."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from refimpl.rankpools import RankPools
from refimpl.tiers.files import Header
from spec.manifest import Manifest

HEADS_MAJOR = "heads_major"

__all__ = [
    "HEADS_MAJOR", "Chunk", "Loaded", "Miss", "Pins", "Prefix", "Stored", "TierPathError",
    "file_manifest",
]  # fmt: skip


class TierPathError(ValueError):
    """A tier folder that cannot be used (not a folder, cannot be created, not readable
    and writable): one clear error, from ``DiskTier(path)``."""


@dataclass(frozen=True, slots=True)
class Stored:
    """A request's published chunks: keys, paths, manifests (in token order), KV bytes."""

    keys: tuple[str, ...]
    paths: tuple[Path, ...]
    manifests: tuple[Manifest, ...]
    nbytes: int
    checks: int = 0  # checksum comparisons that passed on the way (hashing is not one)

    @property
    def key(self) -> str:
        """The last chunk's key: it names the whole stored prefix."""
        return self.keys[-1]

    @property
    def path(self) -> Path:
        return self.paths[-1]

    @property
    def manifest(self) -> Manifest:
        return self.manifests[-1]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A verified hit of ``num_tokens`` tokens: the request owns ``blocks`` of ``pools``."""

    key: str  # the last chunk read
    num_tokens: int
    pools: RankPools
    blocks: tuple[int, ...]
    checks: int  # blocks whose bytes hashed to the manifest's checksum


@dataclass(frozen=True, slots=True)
class Miss:
    """No whole, matching chunk at the start of the tokens; ``reason`` says why."""

    key: str
    reason: str


@dataclass(slots=True)
class Chunk:
    """One open, validated chunk file of a prefix (the open file is the reader's pin)."""

    key: str
    span: tuple[int, int]
    file: BinaryIO
    header: Header
    manifest: Manifest


@dataclass(slots=True)
class Prefix:
    """The longest run of whole chunks for some tokens, open and pinned until ``close``."""

    chunks: list[Chunk]
    stopped: str  # why the run ends ("" when every chunk of the tokens is in it)
    unpin: Callable[[list[str]], None]  # the tier's: drops this reader's pins
    closed: bool = field(default=False)
    bad: Chunk | None = None  # the chunk whose bytes failed their checksum on a read

    @property
    def num_tokens(self) -> int:
        return self.chunks[-1].span[1]

    def fit(self, tokens: int) -> Prefix | None:
        """This prefix cut to the chunks that end within ``tokens`` (the rest closed and
        unpinned); None (every chunk closed) when not even the first one does."""
        keep = [c for c in self.chunks if c.span[1] <= tokens]
        drop = self.chunks[len(keep) :]
        for c in drop:
            c.file.close()
        self.unpin([c.key for c in drop])
        self.chunks = keep
        if drop:
            self.stopped = f"{len(drop)} chunk(s) past the {tokens} tokens the blocks hold"
        if not keep:
            self.closed = True
            return None
        return self

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for c in self.chunks:
                c.file.close()
            self.unpin([c.key for c in self.chunks])

    def __enter__(self) -> Prefix:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def file_manifest(m: Manifest) -> Manifest:
    """The manifest of canonical blocks: the same KV, as one tp=1 heads_major source."""
    if m.prefix_blocks:
        raise ValueError(
            f"{m.request_id!r}: a file holds every block; prefix_blocks={m.prefix_blocks}"
        )
    canon = {"layout": HEADS_MAJOR, "src_tp": 1, "src_cp": 1, "dst_tp": 1, "dst_cp": 1}
    return Manifest.from_json_dict({**m.to_json_dict(), **canon})


class Pins:
    """A tier's readers in this process, per key; a key removed while read is unlinked
    (``unlink(key)``) when its last reader is done, and no new reader takes it meanwhile
    (``live``: a lookup misses it, the spec's HostEvict then HostFree)."""

    def __init__(self, unlink: Callable[[str], object]) -> None:
        self._unlink = unlink
        self._lock = threading.Lock()
        self._pins: Counter[str] = Counter()
        self._doomed: set[str] = set()

    def count(self, key: str) -> int:
        with self._lock:
            return self._pins[key]

    def pin(self, key: str) -> None:
        with self._lock:
            self._pins[key] += 1

    def defer(self, key: str) -> bool:
        """True: ``key`` is read now, its removal waits for the last reader."""
        with self._lock:
            if self._pins[key]:
                self._doomed.add(key)
                return True
            return False

    def live(self, key: str) -> None:
        """FileNotFoundError if ``key`` was removed while read: no new reader takes it."""
        with self._lock:
            if key in self._doomed:
                raise FileNotFoundError(f"{key} was removed (its readers finish)")

    def published(self, key: str) -> None:
        """A writer published ``key`` anew: the removal waiting for the old file's readers
        is not this file's (they keep the old file's bytes: POSIX)."""
        with self._lock:
            self._doomed.discard(key)

    def unpin(self, keys: list[str]) -> None:
        drop = []
        with self._lock:
            for k in keys:
                self._pins[k] -= 1
                if not self._pins[k]:
                    del self._pins[k]
                    if k in self._doomed:
                        self._doomed.discard(k)
                        drop.append(k)
        for k in drop:
            self._unlink(k)
