"""``DiskTier``: a directory of KV files, one per content key, crash-safe.

    tier = DiskTier("/var/kv", model)               # a restart: orphans removed, files adopted
    off = offload(device, geo, tier, None, "req-1", token_ids)   # -> Stored (published)
    back = reload(tier, None, device, geo, "req-1", token_ids)   # verified, else MissError

One file holds one request's KV as whole canonical blocks (every head, heads_major, the
writer's block size): the tensor ``kv`` of shape ``[blocks, *block_shape]`` and, in the
safetensors metadata, its manifest: the spec's one ``Manifest`` (model identity, RoPE,
geometry, token ids, per-block xxh3 checksums of ``refimpl.checksum``) stating a tp=1,
heads_major source, so ``KVGeometry.from_manifest_source`` is the file's geometry. The
file's name is a content key: xxh3 of the model identity, the KV's meaning (dtype,
layers, heads, head dim, cache fields) and the token ids; block size, layout and TP are
not in it, so a file written from a TP=2 worker reloads onto a TP=1 one.

``load`` reads a file as a hit only when the header fits the file's size, the manifest
parses (the strict parser of ``spec.manifest``), is a canonical file manifest, passes
``check_compatible`` against this tier's model, holds exactly the token ids asked for,
and the tensor's dtype and shape are the manifest's; all of it before anything is
allocated. Then the bytes are read and every block must hash to the manifest's checksum.
Anything else is a ``Miss`` with its reason, never a partial hit.

The files themselves (temp name per writer, fsync, atomic rename, orphan sweep) are
``refimpl.tiers.files``: a load opens only a regular file of the tier's own folder (no
symlink, FIFO, device or folder at the name: a miss saying which), the header's size and
member count are checked before it is parsed, and ``DiskTier(path)`` opens any folder a
crash or another program left (the sweep skips what is not a writer's temp file; a path
that is no usable folder is one ``TierPathError``).

In the spec's vocabulary: writing the temp file is the store's
``PrefillOffloadCopy`` steps, the rename is ``PrefillOffloadCommit`` (a file is visible
only once every block is in it: ``PublishAfterCommit``); a load is ``PrefillReloadBegin``
/ ``Copy`` / ``Commit`` (a block counts only once verified: ``NoPartialUse``), and a miss
is the failed load that falls back to recompute.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.checksum import block_checksum, bytes_checksum
from refimpl.engine.data import RankPools
from refimpl.tiers.files import (
    Header,
    TornFileError,
    open_published,
    published_names,
    published_path,
    read_header,
    read_into,
    sweep_orphans,
    write_published,
)
from spec.manifest import Manifest, check_compatible
from spec.manifest import ManifestError as SpecManifestError
from spec.manifest import from_json as manifest_from_json

FORMAT = "kvown-disk-kv/1"
FORMAT_KEY, MANIFEST_KEY, TENSOR = "kvown.format", "kvown.manifest", "kv"
HEADS_MAJOR = "heads_major"


class TierPathError(ValueError):
    """A tier folder that cannot be used (not a folder, cannot be created, not readable
    and writable): one clear error, from ``DiskTier(path)``."""


@dataclass(frozen=True, slots=True)
class Stored:
    """A published file: its key, path, manifest, and the bytes of KV it holds."""

    key: str
    path: Path
    manifest: Manifest
    nbytes: int
    checks: int = 0  # checksum comparisons that passed on the way to the file


@dataclass(frozen=True, slots=True)
class Loaded:
    """A verified hit: the request owns ``blocks`` of ``pools`` (the file's geometry)."""

    key: str
    manifest: Manifest
    pools: RankPools
    blocks: tuple[int, ...]
    checks: int  # blocks whose bytes hashed to the manifest's checksum


@dataclass(frozen=True, slots=True)
class Miss:
    """No whole, matching file for the key; ``reason`` says why."""

    key: str
    reason: str


def file_manifest(m: Manifest) -> Manifest:
    """The manifest of canonical blocks: the same KV, as one tp=1 heads_major source."""
    if m.prefix_blocks:
        raise ValueError(
            f"{m.request_id!r}: a file holds every block; prefix_blocks={m.prefix_blocks}"
        )
    return Manifest.from_json_dict(
        {
            **m.to_json_dict(),
            "layout": HEADS_MAJOR,
            "src_tp": 1,
            "src_cp": 1,
            "dst_tp": 1,
            "dst_cp": 1,
        }
    )


class DiskTier:
    """A directory of published KV files for one model; construction is a restart."""

    def __init__(self, directory: str | os.PathLike[str], model: ModelIdentity) -> None:
        self.directory = Path(directory)
        self.model = model
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not self.directory.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a folder")
            if not os.access(self.directory, os.R_OK | os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "not readable and writable")
            self.orphans_removed = sweep_orphans(self.directory)  # temp files of dead writers
            self.adopted = published_names(self.directory)  # checked on read, one by one
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise TierPathError(f"DiskTier: {str(self.directory)[:200]!r}: {why}") from None

    # ------------------------------------------------------------ names
    def key(self, geometry: KVGeometry, token_ids: Sequence[int]) -> str:
        """The content key: this model, the KV's meaning, the token ids."""
        g, mi = geometry, self.model
        ident = [
            mi.model_id, mi.adapter_id, mi.quantization, mi.rope.to_json_dict(),
            g.dtype, g.num_layers, g.kv_heads, g.head_dim, list(g.cache_fields),
            [int(t) for t in token_ids],
        ]  # fmt: skip
        return "kv-" + bytes_checksum(json.dumps(ident, separators=(",", ":")).encode())

    def path(self, key: str) -> Path:
        return published_path(self.directory, key)

    def keys(self) -> list[str]:
        return published_names(self.directory)

    def remove(self, key: str) -> bool:
        """Unpublish: the name goes at once; an open reader keeps its bytes (POSIX)."""
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    # ------------------------------------------------------------ store
    def store(self, manifest: Manifest, kv: torch.Tensor) -> Stored:
        """Publish ``kv`` ``[blocks, *block_shape]`` (canonical, CPU) under its key."""
        m = manifest
        geo = KVGeometry.from_manifest_source(m)
        problems = self._reasons(m, geo, m.token_ids)
        want = (m.num_blocks, *geo.rank_pool_geometry().block_shape)
        if kv.dtype != geo.torch_dtype or tuple(kv.shape) != want:
            problems.append(f"kv is {kv.dtype}{tuple(kv.shape)}, the manifest says {want}")
        if problems:
            raise ValueError(f"DiskTier.store {m.request_id!r}: " + "; ".join(problems))
        key = self.key(geo, m.token_ids)
        meta = {FORMAT_KEY: FORMAT, MANIFEST_KEY: m.to_json()}
        path = write_published(self.directory, key, meta, [(TENSOR, kv.contiguous())])
        return Stored(key, path, m, kv.numel() * kv.element_size())

    # ------------------------------------------------------------ load
    def load(
        self,
        geometry: KVGeometry,
        token_ids: Sequence[int],
        request_id: str,
        *,
        into: RankPools | None = None,
    ) -> Loaded | Miss:
        """The verified file for ``token_ids`` (the KV ``geometry`` means), else a Miss.

        ``into``: staging pools of the file's geometry to load into (a reused buffer);
        default fresh ones. Blocks are read and verified one at a time, so a corrupt block
        stops the read; on a miss the blocks taken in ``into`` are given back."""
        key = self.key(geometry, token_ids)
        try:
            f = open_published(self.path(key))  # a regular file of the tier, or refused
        except FileNotFoundError:
            return Miss(key, "not published")
        except TornFileError as e:
            return Miss(key, f"TornFileError: {e}")
        except OSError as e:
            return Miss(key, f"cannot read: {e.strerror or e}")
        with f:
            try:
                header = read_header(f)
                m, geo = self._check(header, geometry, token_ids)
            except (TornFileError, SpecManifestError) as e:
                return Miss(key, f"{type(e).__name__}: {e}")
            except (OSError, ValueError, MemoryError) as e:  # an unreadable or strange file
                return Miss(key, f"{type(e).__name__}: {str(e)[:200]}")
            if into is None:
                pools = geo.make_pools(m.num_blocks)  # allocated only now, to the size checked
            else:
                geo.check_pools(into, "DiskTier.load into")
                pools = into
            blocks = tuple(pools.alloc.allocate(request_id, m.num_blocks, epoch=m.epoch))
            kv, size = pools.pools[0].kv, geo.rank_pool_geometry().block_bytes
            try:
                for i, b in enumerate(blocks):  # read one block, verify it while it is hot
                    read_into(f, header, TENSOR, kv[b], offset=i * size)
                    if (got := block_checksum(kv[b])) != m.block_checksums[i]:
                        want = m.block_checksums[i]
                        raise TornFileError(
                            f"block {i}: bytes hash to {got}, the manifest says {want}"
                        )
            except (TornFileError, OSError) as e:
                pools.alloc.free(request_id)
                return Miss(key, f"{type(e).__name__}: {e}")
        return Loaded(key, m, pools, blocks, len(blocks))

    def _check(
        self, header: Header, geometry: KVGeometry, token_ids: Sequence[int]
    ) -> tuple[Manifest, KVGeometry]:
        meta = header.metadata
        if meta.get(FORMAT_KEY) != FORMAT or MANIFEST_KEY not in meta:
            raise TornFileError(f"metadata: not a {FORMAT} file")
        m = manifest_from_json(meta[MANIFEST_KEY])
        geo = KVGeometry.from_manifest_source(m)
        local = geometry.with_(tp=1, cp=1, layout=HEADS_MAJOR, block_size=m.block_size)
        reasons = self._reasons(m, local, token_ids)
        e = header.entries.get(TENSOR)
        want = (m.num_blocks, *geo.rank_pool_geometry().block_shape)
        if set(header.entries) != {TENSOR} or e is None:
            reasons.append(f"tensors {sorted(header.entries)}; a file holds {TENSOR!r} alone")
        elif e.dtype != geo.torch_dtype or e.shape != want:
            reasons.append(f"tensor {TENSOR!r} is {e.dtype}{e.shape}, the manifest says {want}")
        if reasons:
            raise SpecManifestError(reasons)
        return m, geo

    def _reasons(self, m: Manifest, local: KVGeometry, token_ids: Sequence[int]) -> list[str]:
        """Why ``m`` is not this tier's file of ``token_ids`` (empty: it is)."""
        out = list(check_compatible(m, local.to_local_config(self.model)).reasons)
        canon = (m.layout, m.src_tp, m.src_cp, m.dst_tp, m.dst_cp, m.prefix_blocks)
        if canon != (HEADS_MAJOR, 1, 1, 1, 1, 0):
            out.append(f"not canonical blocks (layout, tp, cp, prefix): {canon}")
        if len(m.block_checksums) != m.num_blocks:
            out.append(f"{len(m.block_checksums)} checksums for {m.num_blocks} blocks")
        if m.token_ids != tuple(token_ids):
            out.append("token_ids: the file's are not the ones asked for")
        return out
