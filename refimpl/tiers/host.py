"""``HostTier`` (``refimpl.api.HostTier``): KV chunks in host memory under the disk tier's
chained prefix keys.

    host = HostTier(model, capacity_bytes=8 << 30)
    offload(device, geo, host, None, "req-1", token_ids)      # -> Kept (chunks held)
    host.lookup(geo, longer_ids)                              # tokens of the stored prefix
    back = reload(host, None, device, geo, "req-2", longer_ids, free_host=False)

The host-pool path of ``offload``/``reload`` (a handoff into host pools) moves one
request under its own name: a longer prompt never hits it. This tier is the host's
prefix cache, on the one key scheme (``refimpl.tiers.chunks.prefix_keys``, the disk
tier's): a request's KV is held in chunks of ``chunk_tokens`` tokens, each one tensor of
canonical blocks (every head, heads_major, the writer's block size) with each block's
checksum, keyed by the chained hash of every token up to the chunk's end, so a longer
prompt hits the chunks of a shorter one it starts with, and a chunk already held (a
shared prefix) is not copied again.

``offload``: each chunk not yet held is copied out of the request's blocks in one
copy per run of block ids (and per layer where an engine's layers are separate tensors)
into its own host tensor and hashed there, once; the least recently used chunks are
dropped to make room (never one of this request's); a chunk that cannot fit ends the
run kept. ``reload``: the longest run of held chunks from the first (each the chunk of
those tokens at that place after the one before it); the request's blocks are RESERVED
(the prompt and ``decode_room``, or the engine's ``blocks=``, ``moves.reserve``), every
block lands verified against its checksum (``kvio.land_chunk``) and is committed; a bad
block gives every reserved block back (``MissError``, nothing committed) and drops that
chunk. A reader holds the chunk tensors it reads (dropping them meanwhile frees nothing
under it). Synchronous, on the caller's thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.engine.data import RankPools
from refimpl.errors import MissError
from refimpl.tiers.chunks import CHUNK_TOKENS, chunk_spans, prefix_keys
from refimpl.tiers.files import TornFileError
from refimpl.tiers.kvio import chunk_data, land_chunk
from refimpl.tiers.moves import Reloaded, check_request, check_room, give_back, reserve

__all__ = ["HostChunk", "HostTier", "Kept"]


@dataclass(frozen=True, slots=True)
class HostChunk:
    key: str
    parent: str  # the key of the chunk before it ("" for the first)
    span: tuple[int, int]
    tokens: tuple[int, ...]
    data: torch.Tensor  # [blocks, layers, fields, heads, block_size, head_dim], canonical
    checksums: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


@dataclass(frozen=True, slots=True)
class Kept:
    """An offload to a ``HostTier``: ``keys`` the request's chunks held now (a leading
    run: all of them unless room ran out), ``added`` of them copied by this call (the
    others were held already), ``nbytes`` the bytes copied."""

    request_id: str
    keys: tuple[str, ...]
    num_tokens: int
    added: int
    nbytes: int


class HostTier:
    """Host-memory KV chunks of one model, at most ``capacity_bytes`` of them."""

    def __init__(
        self, model: ModelIdentity, capacity_bytes: int, *, chunk_tokens: int = CHUNK_TOKENS
    ) -> None:
        chunk_spans(0, chunk_tokens)  # ValueError unless an int >= 1
        if type(capacity_bytes) is not int or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes={capacity_bytes!r} must be an int >= 0")
        self.model, self.capacity_bytes, self.chunk_tokens = model, capacity_bytes, chunk_tokens
        self._chunks: OrderedDict[str, HostChunk] = OrderedDict()  # least recent first
        self._lock = threading.Lock()

    def chunk_keys(self, geometry: KVGeometry, token_ids: Sequence[int]) -> list[str]:
        return prefix_keys(self.model, geometry, token_ids, self.chunk_tokens)

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._chunks)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._chunks.values())

    def remove(self, key: str) -> bool:
        with self._lock:
            return self._chunks.pop(key, None) is not None

    def prefix(self, geometry: KVGeometry, token_ids: Sequence[int]) -> list[HostChunk]:
        """The longest run of held chunks of ``token_ids`` from the first (touched: the
        run's first chunk is the last to be dropped)."""
        if not token_ids:
            return []
        keys = self.chunk_keys(geometry, token_ids)
        spans = chunk_spans(len(token_ids), self.chunk_tokens)
        out: list[HostChunk] = []
        with self._lock:
            for i, (key, (s, e)) in enumerate(zip(keys, spans, strict=True)):
                c = self._chunks.get(key)
                want = tuple(int(t) for t in token_ids[s:e])
                if c is None or c.span != (s, e) or c.tokens != want:
                    break
                if c.parent != (keys[i - 1] if i else ""):
                    break
                out.append(c)
            for c in reversed(out):
                self._chunks.move_to_end(c.key)
        return out

    def lookup(self, geometry: KVGeometry, token_ids: Sequence[int]) -> int:
        """Tokens of the longest held prefix of ``token_ids``."""
        got = self.prefix(geometry, token_ids)
        return got[-1].span[1] if got else 0

    # ------------------------------------------------------------ offload
    def put(
        self,
        device: RankPools,
        geometry: KVGeometry,
        request_id: str,
        token_ids: Sequence[int],
        *,
        free_device: bool = False,
    ) -> Kept:
        """Hold ``request_id``'s KV of ``token_ids`` (its first blocks on ``device``)."""
        check_request(self.chunk_tokens, device, geometry, token_ids)
        tokens = tuple(int(t) for t in token_ids)
        need, bs = geometry.blocks_for(len(tokens)), geometry.block_size
        held = device.alloc.blocks_of(request_id)
        if len(held) < need:
            raise ValueError(
                f"{request_id!r} holds {len(held)} blocks; {len(tokens)} tokens need {need}"
            )
        keys = self.chunk_keys(geometry, tokens)
        spans = chunk_spans(len(tokens), self.chunk_tokens)
        have = {c.key for c in self.prefix(geometry, tokens)}
        g = device.geometry
        kept, added, nbytes = 0, 0, 0
        for i, (s, e) in enumerate(spans):
            if keys[i] in have:
                kept = i + 1
                continue
            mine = held[s // bs : -(-e // bs)]
            shape = (len(mine), g.num_layers, g.num_fields, device.kv_heads, bs, g.head_dim)
            size = torch.Size(shape).numel() * g.dtype.itemsize
            if not self._room(size, set(keys[:i])):
                break
            data = torch.empty(shape, dtype=g.dtype)  # the tier's own memory, not staging
            _, sums = chunk_data(device, mine, data)  # one copy, each block hashed once
            parent = keys[i - 1] if i else ""
            chunk = HostChunk(keys[i], parent, (s, e), tokens[s:e], data, tuple(sums))
            with self._lock:
                self._chunks[keys[i]] = chunk
            kept, added, nbytes = i + 1, added + 1, nbytes + size
        if free_device and kept == len(spans):
            device.alloc.free(request_id)
        end = spans[kept - 1][1] if kept else 0
        return Kept(request_id, tuple(keys[:kept]), end, added, nbytes)

    def _room(self, size: int, keep: set[str]) -> bool:
        """Drop the least recently used chunks (none of ``keep``) until ``size`` fits."""
        with self._lock:
            used = sum(c.nbytes for c in self._chunks.values())
            for key in [k for k in self._chunks if k not in keep]:
                if used + size <= self.capacity_bytes:
                    break
                used -= self._chunks.pop(key).nbytes
            return used + size <= self.capacity_bytes

    # ------------------------------------------------------------ reload
    def get(
        self,
        device: RankPools,
        geometry: KVGeometry,
        request_id: str,
        token_ids: Sequence[int],
        *,
        decode_room: int = 0,
        free_host: bool = False,
        epoch: int = 1,
        blocks: Sequence[int] | None = None,
    ) -> Reloaded:
        """Reload the longest held prefix of ``token_ids`` into ``device`` (verified), else
        ``MissError`` with nothing reserved."""
        check_request(self.chunk_tokens, device, geometry, token_ids)
        given = check_room(device, request_id, decode_room, blocks)
        hit = self.prefix(geometry, token_ids)
        if not hit:
            raise MissError(f"{request_id!r}: no held chunk starts {len(token_ids)} tokens")
        ends = [c.span[1] for c in hit]
        got, fit = reserve(
            device, geometry, request_id, len(token_ids), decode_room, given, ends, epoch
        )
        hit, bs, checks = hit[:fit], geometry.block_size, 0
        try:
            for c in hit:
                s, e = c.span
                try:
                    checks += land_chunk(
                        c.data, c.checksums, e - s, device, got[s // bs : -(-e // bs)]
                    )
                except TornFileError:
                    self.remove(c.key)  # a bad copy: the next lookup stops before it
                    raise
        except BaseException as e:
            give_back(device, request_id, epoch)
            if isinstance(e, TornFileError):
                raise MissError(f"{request_id!r}: TornFileError: {e}") from e
            raise
        device.alloc.commit(request_id, epoch)
        if free_host:
            for c in hit:
                self.remove(c.key)
        keys = tuple(c.key for c in hit)
        nbytes = sum(c.nbytes for c in hit)
        return Reloaded(request_id, got, ends[fit - 1], len(hit), nbytes, checks, keys)
