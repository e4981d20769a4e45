"""``DiskTier``: a directory of KV chunk files keyed by chained prefix hashes, crash-safe.

    tier = DiskTier("/var/kv", model)               # a restart: orphans removed, files adopted
    off = offload(device, geo, tier, None, "req-1", token_ids)   # -> Stored (published)
    back = reload(tier, None, device, geo, "req-2", longer_ids)  # the longest stored prefix
    tier.lookup(geo, longer_ids)                                 # its length in tokens

A request's KV is stored in chunks of ``chunk_tokens`` tokens (default 256, a multiple of
the writer's block size), one file per chunk, named by ``refimpl.tiers.chunks``: the
chained hash of every token up to the chunk's end, rooted in the model identity, the KV's
meaning (dtype, layers, heads, head dim, cache fields) and the chunk size. Another model,
dtype, head count or chunking roots another chain, so it never shares a key. Block size,
layout and TP are not in the key: a file holds canonical blocks (every head, heads_major,
the writer's block size) and states them, so a file written from a TP=2 worker reloads
onto a TP=1 one with another block size. A lookup hits the longest run of chunks from
the first that are published and whole; a longer prompt hits the chunks of a shorter one
it starts with. A partial trailing chunk is stored under its own key (the rule is in
``refimpl.tiers.chunks``): the same prompt again hits it, a longer one stops before it.

One file: the tensor ``kv`` ``[blocks, *block_shape]`` and, in the safetensors metadata,
the chunk's manifest (the spec's one ``Manifest``: model identity, RoPE, geometry, the
chunk's token ids and start position, per-block xxh3 of ``refimpl.checksum``, a tp=1
heads_major source) and the key of the chunk before it. A chunk reads as a hit only when
its header fits the file's size, the manifest parses (the strict parser), passes
``check_compatible`` against this tier's model and the reader's geometry, holds exactly
the tokens of that chunk at that position, names the chunk before it, and the tensor's
dtype and shape are the manifest's; all of it before anything is allocated (a file's
header is parsed once per version: device, inode, size, mtime, ctime; a stale entry could
only name checksums the bytes must still match). Then every block must hash to its
checksum while it is read, else the whole load is a ``Miss``, the blocks taken for it are
given back and that chunk's file is unpublished (the next lookup stops before it).

A reader pins what it reads (``open_prefix``: files open to the read's end); ``remove``
of a key read makes lookups miss it now, unlinks it after the last reader. The files
(temp name per writer, fsync, atomic rename, orphan sweep, regular files only) are
``refimpl.tiers.files``; a store's chunks are renamed in order once all are flushed: all
or none, and a crash among the renames leaves a shorter stored prefix.

The spec's shared host cache (toured in ``refimpl/testing/on_api/worlds/host_cache.py``):
``open_prefix`` HostLookup, temp files HostStoreCopy, renames HostPublish, ``remove``
HostEvict (HostFree at the last reader), a bad block HostLoadFail (the hit unpublished).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.switches import FAILED_LOAD_KEEPS_HIT as KEEPS_HIT
from refimpl.api.switches import FAILED_STORE_VISIBLE, TIER_SWITCHES, check_switches
from refimpl.checksum import byte_view
from refimpl.rankpools import RankPools
from refimpl.tiers.chunks import CHUNK_TOKENS, FORMAT, chunk_spans, prefix_keys
from refimpl.tiers.files import (
    Entry,
    Header,
    Pending,
    Stopped,
    TornFileError,
    header_bytes,
    open_published,
    published_names,
    published_path,
    read_header,
    sweep_orphans,
    write_batch,
)
from refimpl.tiers.kvio import Staging, block_views, read_chunk
from refimpl.tiers.records import (
    HEADS_MAJOR,
    Chunk,
    Loaded,
    Miss,
    Pins,
    Prefix,
    Stored,
    TierPathError,
    file_manifest,
)
from refimpl.tiers.validate import (
    FORMAT_KEY,
    MANIFEST_KEY,
    PARENT_KEY,
    TENSOR,
    chunk_reasons,
    manifest_reasons,
    parse_manifest,
)
from spec.manifest import LocalConfig, Manifest
from spec.manifest import ManifestError as SpecManifestError

PARSED_CAP = 4096  # parsed headers kept (the oldest goes first)

__all__ = ["DiskTier", "Loaded", "Miss", "Prefix", "Stored", "TierPathError", "file_manifest"]


class DiskTier:
    """A directory of published KV chunk files for one model; construction is a restart."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        model: ModelIdentity,
        *,
        chunk_tokens: int = CHUNK_TOKENS,
        mutants: Iterable[str] = (),  # bug switches (``api.switches.TIER_SWITCHES``): tests
    ) -> None:
        chunk_spans(0, chunk_tokens)  # ValueError unless an int >= 1
        self.mutants = check_switches(mutants, TIER_SWITCHES, "DiskTier")
        self.directory, self.model, self.chunk_tokens = Path(directory), model, chunk_tokens
        self.staging = Staging()  # reused by every transfer of this tier
        self._pins = Pins(self._unlink)
        self._locals: dict[tuple[KVGeometry, int], LocalConfig] = {}
        # key -> (file version, header, manifest): a file's header is parsed once per
        # version (device, inode, size, mtime, ctime); its bytes are verified every read
        self._parsed: dict[str, tuple[tuple[int, ...], Header, Manifest]] = {}
        self._parsed_lock = threading.Lock()
        try:
            if not os.fspath(directory):  # Path("") is the working folder: never meant
                raise ValueError("an empty path (say '.' for the working folder)")
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
    def chunk_keys(self, geometry: KVGeometry, token_ids: Sequence[int]) -> list[str]:
        """The key of each chunk of ``token_ids`` (the KV ``geometry`` means)."""
        return prefix_keys(self.model, geometry, token_ids, self.chunk_tokens)

    def key(self, geometry: KVGeometry, token_ids: Sequence[int]) -> str:
        """The key of the last chunk: it names the whole of ``token_ids``."""
        if not token_ids:
            raise ValueError("key: no token ids")
        return self.chunk_keys(geometry, token_ids)[-1]

    def path(self, key: str) -> Path:
        return published_path(self.directory, key)

    def keys(self) -> list[str]:
        return published_names(self.directory)

    def lookup(self, geometry: KVGeometry, token_ids: Sequence[int]) -> int:
        """Tokens of the longest whole stored prefix of ``token_ids`` (headers checked,
        nothing allocated, nothing kept open)."""
        got = self.open_prefix(geometry, token_ids)
        if isinstance(got, Miss):
            return 0
        with got:
            return got.num_tokens

    def pinned(self, key: str) -> int:
        """Readers of this process holding ``key`` open now."""
        return self._pins.count(key)

    def remove(self, key: str) -> bool:
        """Unpublish ``key`` now, unlink it after its last reader here (False: none was)."""
        return self.path(key).exists() if self._pins.defer(key) else self._unlink(key)

    def _unlink(self, key: str) -> bool:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    # ------------------------------------------------------------ store
    def pending(
        self,
        base: dict[str, Any],
        token_ids: Sequence[int],
        index: int,
        keys: Sequence[str],
        data: list[memoryview],
        checksums: list[str],
    ) -> tuple[Pending, Manifest]:
        """The file of chunk ``index`` of ``token_ids``: ``base`` (a canonical manifest's
        JSON dict, from position 0) narrowed to the chunk, with its data and checksums."""
        s, e = chunk_spans(len(token_ids), self.chunk_tokens)[index]
        d = {**base, "token_ids": list(token_ids[s:e]), "num_tokens": e - s}
        m = Manifest.from_json_dict({**d, "start_pos": s, "block_checksums": checksums})
        geo = KVGeometry.from_manifest_source(m)
        shape = (m.num_blocks, *geo.rank_pool_geometry().block_shape)
        parent = keys[index - 1] if index else ""
        meta = {FORMAT_KEY: FORMAT, MANIFEST_KEY: m.to_json(), PARENT_KEY: parent}
        return Pending(keys[index], meta, [(TENSOR, geo.torch_dtype, shape)], data, m), m

    def publish(
        self, files: Iterable[Pending], stop: Callable[[], bool] | None = None
    ) -> list[Path]:
        """Write, flush, then rename ``files`` in order (``files.write_batch``)."""
        last = FAILED_STORE_VISIBLE not in self.mutants  # a bug switch: renames regardless
        return write_batch(self.directory, files, stop, self._remember, last)

    def _remember(self, p: Pending, st: os.stat_result) -> None:
        """A chunk this tier just published: its header and manifest are what it wrote,
        kept for that inode's version (a reader of another file parses its own)."""
        self._pins.published(p.name)  # a removal waiting for old readers is not this file's
        if not isinstance(p.note, Manifest):
            return
        (name, dtype, shape), size = p.entries[0], st.st_size
        start = len(header_bytes(p.metadata, p.entries))
        entry = Entry(name, dtype, tuple(shape), 0, size - start)
        header = Header(dict(p.metadata), {name: entry}, start, size)
        version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        self._keep(p.name, version, header, p.note)

    def _keep(self, key: str, version: tuple[int, ...], header: Header, m: Manifest) -> None:
        with self._parsed_lock:  # an offload's thread and the engine's may both keep
            if len(self._parsed) >= PARSED_CAP:
                self._parsed.pop(next(iter(self._parsed)))
            self._parsed[key] = (version, header, m)

    def store(self, manifest: Manifest, kv: torch.Tensor) -> Stored:
        """Publish ``kv`` ``[blocks, *block_shape]`` (canonical, CPU, from position 0)."""
        m = manifest
        geo = KVGeometry.from_manifest_source(m)
        local = self._local(geo, m.block_size)
        problems = manifest_reasons(m, local, m.token_ids, (0, m.num_tokens))
        want = (m.num_blocks, *geo.rank_pool_geometry().block_shape)
        if kv.dtype != geo.torch_dtype or tuple(kv.shape) != want:
            problems.append(f"kv is {kv.dtype}{tuple(kv.shape)}, the manifest says {want}")
        if self.chunk_tokens % m.block_size:
            problems.append(f"chunk_tokens {self.chunk_tokens} is no multiple of {m.block_size}")
        if problems:
            raise ValueError(f"DiskTier.store {m.request_id!r}: " + "; ".join(problems))
        keys = self.chunk_keys(geo, m.token_ids)
        base = m.to_json_dict()
        per = self.chunk_tokens // m.block_size
        kv = kv.contiguous()
        out = []
        for i in range(len(keys)):
            mine = range(i * per, min((i + 1) * per, m.num_blocks))
            sums = list(m.block_checksums[mine.start : mine.stop])
            out.append(
                self.pending(base, m.token_ids, i, keys, [byte_view(kv[b]) for b in mine], sums)
            )
        paths = self.publish(p for p, _ in out)
        nbytes = kv.numel() * kv.element_size()
        return Stored(tuple(keys), tuple(paths), tuple(mm for _, mm in out), nbytes)

    # ------------------------------------------------------------ load
    def open_prefix(self, geometry: KVGeometry, token_ids: Sequence[int]) -> Prefix | Miss:
        """The longest run of whole chunks of ``token_ids`` from the first, open and
        pinned (close it), else a Miss saying why the first chunk is not one."""
        if not token_ids:
            return Miss("", "no token ids")
        keys = self.chunk_keys(geometry, token_ids)
        spans = chunk_spans(len(token_ids), self.chunk_tokens)
        chunks: list[Chunk] = []
        why = ""
        for i, (key, span) in enumerate(zip(keys, spans, strict=True)):
            got = self._open_chunk(key, geometry, token_ids, span, keys[i - 1] if i else "")
            if isinstance(got, str):
                why = got
                break
            chunks.append(got)
        if not chunks:
            return Miss(keys[0], why)
        return Prefix(chunks, why, self._pins.unpin)

    def _open_chunk(
        self,
        key: str,
        geometry: KVGeometry,
        token_ids: Sequence[int],
        span: tuple[int, int],
        parent: str,
    ) -> Chunk | str:
        try:
            self._pins.live(key)  # removed while read: FileNotFoundError, a miss
            f = open_published(self.path(key))  # a regular file of the tier, or refused
        except FileNotFoundError:
            return "not published"
        except TornFileError as e:
            return f"TornFileError: {e}"
        except OSError as e:
            return f"cannot read: {e.strerror or e}"
        try:
            st = os.fstat(f.fileno())
            version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            seen = self._parsed.get(key)
            if seen is not None and seen[0] == version:  # parsed before: the same file
                header, m = seen[1], seen[2]
            else:
                header = read_header(f)
                m = parse_manifest(header)
                self._keep(key, version, header, m)
            local = self._local(geometry, m.block_size)
            if why := chunk_reasons(header, m, local, token_ids, span, parent, self.chunk_tokens):
                raise SpecManifestError(why)
        except (TornFileError, SpecManifestError) as e:
            f.close()
            return f"{type(e).__name__}: {e}"
        except (OSError, ValueError, MemoryError) as e:  # an unreadable or strange file
            f.close()
            return f"{type(e).__name__}: {str(e)[:200]}"
        self._pins.pin(key)
        return Chunk(key, span, f, header, m)

    def read(
        self,
        prefix: Prefix,
        pools: RankPools,
        blocks: Sequence[int],
        stop: Callable[[], bool] | None = None,
        unpublish: bool = True,
    ) -> int:
        """Read ``prefix`` into ``blocks`` (the destination's logical blocks from token 0)
        of ``pools``, verifying every block; returns the blocks verified. TornFileError or
        OSError on a bad block (the caller gives ``blocks`` back; the chunk, ``prefix.bad``,
        unpublished unless ``unpublish=False``: ``unpublish_bad`` on the caller's thread),
        ``files.Stopped`` when ``stop()`` turned true."""
        bs = pools.geometry.block_size
        if self.chunk_tokens % bs:
            raise ValueError(f"block size {bs} does not divide chunk_tokens {self.chunk_tokens}")
        checks, views = 0, {}  # each file block size's views of the pools, taken once
        for c in prefix.chunks:
            s, e = c.span
            mine = blocks[s // bs : -(-e // bs)]
            m = c.manifest
            if m.block_size not in views:
                views[m.block_size] = block_views(pools, m.block_size)
            try:
                checks += read_chunk(
                    c.file, c.header, m.block_checksums, e - s, m.block_size, pools, mine,
                    self.staging, stop, views[m.block_size],
                )  # fmt: skip
            except TornFileError:
                prefix.bad = c
                if unpublish:
                    self.unpublish_bad(c)
                raise
        return checks

    def unpublish_bad(self, c: Chunk) -> None:
        """A hit whose bytes failed their checksum: unpublish that file, so the next
        lookup misses instead of failing again (HostLoadFail; vLLM #49176 kept the hit).
        Only when the name still is the file read (a writer may have renamed a whole one
        over it since)."""
        try:
            mine, now = os.fstat(c.file.fileno()), os.lstat(self.path(c.key))
        except OSError:
            return
        same = (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)
        if same and KEEPS_HIT not in self.mutants:
            self._unlink(c.key)

    def load(
        self,
        geometry: KVGeometry,
        token_ids: Sequence[int],
        request_id: str,
        *,
        into: RankPools | None = None,
    ) -> Loaded | Miss:
        """The verified longest stored prefix of ``token_ids``, else a Miss.

        ``into``: canonical pools of the first chunk's geometry (a reused buffer);
        default fresh ones, allocated once every header checked. On a miss the blocks
        taken are given back."""
        got = self.open_prefix(geometry, token_ids)
        if isinstance(got, Miss):
            return got
        with got:
            geo = KVGeometry.from_manifest_source(got.chunks[0].manifest)
            n = geo.blocks_for(got.num_tokens)
            if into is None:
                pools = geo.make_pools(n)  # allocated only now, to the size checked
            else:
                geo.check_pools(into, "DiskTier.load into")
                pools = into
            blocks = tuple(pools.alloc.allocate(request_id, n, epoch=got.chunks[0].manifest.epoch))
            try:
                checks = self.read(got, pools, blocks)
            except (TornFileError, OSError, Stopped) as e:
                pools.alloc.free(request_id)
                return Miss(got.chunks[-1].key, f"{type(e).__name__}: {e}")
            return Loaded(got.chunks[-1].key, got.num_tokens, pools, blocks, checks)

    def _local(self, geometry: KVGeometry, block_size: int) -> LocalConfig:
        """The reader's config for a file of ``block_size`` (one per geometry and size)."""
        key = (geometry, block_size)
        if (got := self._locals.get(key)) is None:
            local = geometry.with_(tp=1, cp=1, layout=HEADS_MAJOR, block_size=block_size)
            got = self._locals[key] = local.to_local_config(self.model)
        return got
