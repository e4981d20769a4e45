"""What a ``DiskTier`` hands out: a store's published chunks (``Stored``), a verified
hit (``Loaded``), a miss with its reason (``Miss``), and a reader's open, pinned run of
chunk files (``Prefix`` of ``Chunk``); ``TierPathError`` for a folder that cannot be a
tier. The tier itself is ``refimpl.api.disk``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from refimpl.engine.data import RankPools
from refimpl.tiers.files import Header
from spec.manifest import Manifest

__all__ = ["Chunk", "Loaded", "Miss", "Prefix", "Stored", "TierPathError"]


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

    @property
    def num_tokens(self) -> int:
        return self.chunks[-1].span[1]

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
