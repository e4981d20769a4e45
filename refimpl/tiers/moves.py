"""A request's KV between a worker's pools and a ``DiskTier``, as ``Transfer``s.

``start_offload``: the request's first ``blocks_for(len(token_ids))`` blocks are pinned
(a transfer holder increfs them: read-only, kept alive if the request frees them), each
block is hashed once (the chunk manifest's checksum) and written straight from the pool
when ``kvio.direct`` holds, else through one staging buffer of the tier; the chunks are
published by ``DiskTier.publish`` (all flushed, then renamed in order). Settled: the pin
is dropped and, with ``free_device``, the request's blocks are freed once published.

``start_reload``: the longest stored prefix is opened and pinned (a miss raises
``MissError`` before anything is reserved), the request's blocks for the prompt and
``decode_room`` are RESERVED under the request and epoch, the prefix is read into them
(every block verified). Settled: committed (RESERVED -> OWNED) on success; on a bad block
or a cancel quarantined and freed (the writer, our thread, has stopped), so nothing is
half-installed, and a chunk that failed its checksum unpublished then, on the caller's
thread (the spec's HostLoadFail: the hit turns into a miss with the pin given back);
the files are closed (unpinned) either way, and with ``free_host`` the chunks read are
unpublished after the commit.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from refimpl.api.disk import DiskTier, Miss, Prefix, Stored
from refimpl.api.geometry import KVGeometry
from refimpl.errors import MissError
from refimpl.rankpools import RankPools
from refimpl.tiers.chunks import chunk_spans
from refimpl.tiers.files import TornFileError
from refimpl.tiers.kvio import chunk_data, direct
from refimpl.tiers.transfer import Stepper, Transfer
from spec.manifest import Manifest

__all__ = [
    "Reloaded", "check_request", "check_room", "give_back", "reserve", "start_offload",
    "start_reload",
]  # fmt: skip

_PINS = itertools.count(1)
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Reloaded:
    """A committed reload: the request owns ``blocks`` (logical order: the prompt's, then
    the decode room); the first ``num_tokens`` tokens' KV are the stored prefix's."""

    request_id: str
    blocks: tuple[int, ...]
    num_tokens: int  # tokens hit (the longest stored prefix); the rest are the engine's
    chunks: int  # chunk files read
    nbytes: int  # KV bytes read
    checks: int  # blocks whose bytes hashed to their manifest's checksum
    keys: tuple[str, ...]


def _base(
    tier: DiskTier, g: KVGeometry, rid: str, tokens: Sequence[int], epoch: int
) -> dict[str, Any]:
    """The canonical manifest of the whole request (chunks narrow it), as a JSON dict."""
    mi = tier.model
    return {
        "request_id": rid, "model_id": mi.model_id, "adapter_id": mi.adapter_id,
        "token_ids": list(tokens), "num_tokens": len(tokens),
        "cache_fields": list(g.cache_fields), "num_layers": g.num_layers, "dtype": g.dtype,
        "quantization": mi.quantization, "kv_heads": g.kv_heads, "head_dim": g.head_dim,
        "block_size": g.block_size, "layout": "heads_major", "start_pos": 0,
        "rope": mi.rope.to_json_dict(), "src_tp": 1, "src_cp": 1, "dst_tp": 1, "dst_cp": 1,
        "prefix_blocks": 0, "block_checksums": [], "version": _VERSION, "epoch": epoch,
    } | ({} if mi.kv_scales is None else {"kv_scales": list(mi.kv_scales)})  # fmt: skip


def check_request(
    chunk_tokens: int, pools: RankPools, g: KVGeometry, tokens: Sequence[int]
) -> None:
    """A tier transfer's request: token ids, pools of ``g``, blocks that tile a chunk."""
    if not tokens:
        raise ValueError("no token ids")
    g.check_pools(pools, "device pools")
    if chunk_tokens % g.block_size:
        raise ValueError(
            f"block size {g.block_size} does not divide the tier's chunk_tokens {chunk_tokens}"
        )


def check_room(
    device: RankPools, rid: str, decode_room: int, blocks: Sequence[int] | None
) -> list[int] | None:
    """A reload's room, checked before anything is opened: ``decode_room`` tokens after
    the prompt, or the engine's ``blocks`` (registered memory: its scheduler's ids)."""
    if decode_room < 0:
        raise ValueError(f"decode_room={decode_room} must be >= 0")
    if held := device.alloc.blocks_of(rid):
        raise ValueError(f"{rid!r} already holds blocks {list(held)} on the device")
    if blocks is None:
        return None
    if decode_room:
        raise ValueError("decode_room: the engine's blocks= are the request's room")
    ids = device.alloc.check_ids(blocks, f"{rid!r} blocks")
    if not ids:
        raise ValueError(f"{rid!r}: blocks=[]: no block to reload into")
    return ids


def reserve(
    device: RankPools,
    geometry: KVGeometry,
    rid: str,
    num_tokens: int,
    decode_room: int,
    blocks: list[int] | None,
    ends: Sequence[int],
    epoch: int,
) -> tuple[tuple[int, ...], int]:
    """RESERVE a reload's destination (the prompt and ``decode_room``, or the engine's
    ``blocks``) for a hit of chunks ending at ``ends``; returns the blocks (logical
    order) and how many chunks fit them (the engine's blocks may hold fewer tokens)."""
    if blocks is None:
        need = geometry.blocks_for(num_tokens + decode_room)
        return tuple(device.alloc.reserve(rid, need, epoch=epoch)), len(ends)
    room = len(blocks) * geometry.block_size
    fit = sum(1 for e in ends if e <= room)
    if not fit:
        raise MissError(
            f"{rid!r}: {len(blocks)} blocks hold {room} tokens, less than the first stored "
            f"chunk ({ends[0]})"
        )
    return tuple(device.alloc.reserve_ids(rid, blocks, epoch=epoch)), fit


def give_back(device: RankPools, rid: str, epoch: int) -> None:
    """A failed or cancelled reload's blocks go back, never used (its writer stopped)."""
    device.alloc.quarantine(rid)
    device.alloc.unquarantine_and_free(rid, epoch)


def start_offload(
    device: RankPools,
    geometry: KVGeometry,
    tier: DiskTier,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
    background: bool = True,
    stepper: Stepper | None = None,
) -> Transfer[Stored, Stored]:
    """Store ``request_id``'s KV of ``token_ids`` in ``tier`` (see the module)."""
    check_request(tier.chunk_tokens, device, geometry, token_ids)
    tokens = tuple(int(t) for t in token_ids)
    need, bs = geometry.blocks_for(len(tokens)), geometry.block_size
    held = device.alloc.blocks_of(request_id)
    if len(held) < need:
        raise ValueError(
            f"{request_id!r} holds {len(held)} blocks; {len(tokens)} tokens need {need}"
        )
    blocks = held[:need]
    base = _base(tier, geometry, request_id, tokens, epoch)
    keys = tier.chunk_keys(geometry, tokens)
    spans = chunk_spans(len(tokens), tier.chunk_tokens)
    per = tier.chunk_tokens // bs
    g = device.geometry
    shape = (min(per, need), g.num_layers, g.num_fields, device.kv_heads, bs, g.head_dim)
    pin = f"{request_id}@offload{next(_PINS)}"
    device.alloc.incref(pin, blocks)  # read-only until settled, alive if the request frees
    nbytes = need * geometry.canonical_block_bytes

    def work(stop: Any) -> Stored:
        staging = None if direct(device, bs) else tier.staging.take(shape, g.dtype)
        manifests: list[Manifest] = []

        def files() -> Any:
            for i, (s, e) in enumerate(spans):
                mine = blocks[s // bs : -(-e // bs)]
                buf = None if staging is None else staging[: len(mine)]
                data, sums = chunk_data(device, mine, buf)
                p, m = tier.pending(base, tokens, i, keys, data, sums)
                manifests.append(m)
                yield p  # written before the next chunk reuses the buffer

        try:
            paths = tier.publish(files(), stop)
        finally:
            if staging is not None:
                tier.staging.give(staging)
        return Stored(tuple(keys), tuple(paths), tuple(manifests), nbytes)

    def finish(value: Stored | None, error: BaseException | None, cancelled: bool) -> Stored:
        device.alloc.decref(pin, blocks)
        if error is not None:
            raise error
        assert value is not None
        if free_device:
            device.alloc.free(request_id)
        return value

    return Transfer(f"offload {request_id}", work, finish, background=background, stepper=stepper)


def start_reload(
    tier: DiskTier,
    device: RankPools,
    geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    decode_room: int = 0,
    free_host: bool = True,
    epoch: int = 1,
    background: bool = True,
    blocks: Sequence[int] | None = None,
    prefix: Prefix | None = None,
    stepper: Stepper | None = None,
) -> Transfer[int, Reloaded]:
    """Reload the longest stored prefix of ``token_ids`` into ``device`` (see the module).
    ``blocks``: the request's blocks the engine's scheduler chose (registered memory),
    in logical order from token 0; the hit lands in the first of them. ``prefix``: the
    engine's lookup of these tokens, open and pinned (``DiskTier.open_prefix``): read as
    it is (no eviction between the lookup and the load), the transfer's once this
    returns (closed when settled), still the caller's if this raises."""
    check_request(tier.chunk_tokens, device, geometry, token_ids)
    given = check_room(device, request_id, decode_room, blocks)
    mine = prefix is None
    if prefix is None:
        got = tier.open_prefix(geometry, token_ids)
        if isinstance(got, Miss):
            raise MissError(f"{request_id!r}: {tier.path(got.key).name}: {got.reason}")
        prefix = got
    elif (
        prefix.closed
        or [c.key for c in prefix.chunks]
        != tier.chunk_keys(geometry, token_ids)[: len(prefix.chunks)]
    ):
        raise ValueError(f"{request_id!r}: prefix= is closed or not a lookup of these tokens")
    try:
        ends = [c.span[1] for c in prefix.chunks]
        blocks, fit = reserve(
            device, geometry, request_id, len(token_ids), decode_room, given, ends, epoch
        )
        prefix.fit(ends[fit - 1])
    except BaseException:
        if mine:
            prefix.close()
        raise
    hit = blocks[: geometry.blocks_for(prefix.num_tokens)]

    def work(stop: Any) -> int:
        return tier.read(prefix, device, hit, stop, unpublish=False)  # finish unpublishes

    def finish(checks: int | None, error: BaseException | None, cancelled: bool) -> Reloaded:
        try:
            if error is not None:  # nothing installed: the blocks go back, never used
                give_back(device, request_id, epoch)
                if prefix.bad is not None:  # with the blocks, not before (HostLoadFail)
                    tier.unpublish_bad(prefix.bad)
                if isinstance(error, (TornFileError, OSError)) and not cancelled:
                    raise MissError(f"{request_id!r}: {type(error).__name__}: {error}") from error
                raise error
            device.alloc.commit(request_id, epoch)
            if free_host:
                for c in prefix.chunks:
                    tier.remove(c.key)  # unpublished once this reader closes them
        finally:
            prefix.close()
        nbytes = sum(
            c.header.entries["kv"].end - c.header.entries["kv"].begin for c in prefix.chunks
        )
        keys = tuple(c.key for c in prefix.chunks)
        return Reloaded(request_id, blocks, prefix.num_tokens, len(keys), nbytes, checks or 0, keys)

    return Transfer(f"reload {request_id}", work, finish, background=background, stepper=stepper)
