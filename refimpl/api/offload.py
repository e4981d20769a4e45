"""Verified offload and reload: a request's KV between two tiers of one worker.

Both are a ``handoff()`` over a private in-process transport, so the copy is checksummed
end to end and the pins and reservations follow the same rules as between workers. The
request keeps its own name on both tiers (no pin-name or channel convention to learn):

    off = offload(device, device_geo, host, host_geo, "req-1", token_ids, free_device=True)
    back = reload(host, host_geo, device, device_geo, "req-1", token_ids, decode_room=64)
    back.received.blocks    # the request's new device blocks; the host copy is freed

The two geometries may differ (block size, layout, TP), as in any handoff.

The host may be a ``DiskTier`` (a directory, ``refimpl.api.disk``; ``host_geometry``
None): ``offload`` copies the request's KV through the same verified handoff into a
private host staging pool of whole canonical blocks, publishes it as one file and returns
``Stored``; ``free_device`` frees the device blocks only once the file is published.
``reload`` reads the file as a verified hit (else ``MissError``, nothing allocated) into
a staging pool and hands it off to the device, so the receiver's gate, reservation,
checksums and commit are the ones of every handoff; ``free_host`` unpublishes the file
after the commit. A refusal anywhere leaves the device and the directory as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import overload

from refimpl.api.disk import DiskTier, Miss, Stored, file_manifest
from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.handoff import HandoffResult, handoff
from refimpl.api.receiver import Receiver
from refimpl.api.sender import Sender
from refimpl.engine.data import RankPools
from refimpl.errors import MissError
from refimpl.transport import InProcessTransport
from spec.manifest import RopeConfig


def _tier_identity(g: KVGeometry) -> ModelIdentity:
    """Both tiers hold the same model's KV; the identity only has to agree with itself."""
    return ModelIdentity("local-tier", RopeConfig(10000.0, max(2, g.head_dim - g.head_dim % 2)))


def _move(
    src: RankPools,
    src_geometry: KVGeometry,
    dst: RankPools,
    dst_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_source: bool,
    decode_room: int = 0,
    epoch: int = 1,
    model: ModelIdentity | None = None,
) -> HandoffResult:
    t = InProcessTransport()
    model = model or _tier_identity(src_geometry)
    tx = Sender(src, src_geometry, t, model)
    rx = Receiver(dst, dst_geometry, t, model)
    return handoff(
        tx,
        rx,
        request_id,
        token_ids,
        epoch=epoch,
        decode_room=decode_room,
        free_source=free_source,
    )


@overload
def offload(
    device: RankPools,
    device_geometry: KVGeometry,
    host: RankPools,
    host_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
) -> HandoffResult: ...


@overload
def offload(
    device: RankPools,
    device_geometry: KVGeometry,
    host: DiskTier,
    host_geometry: None,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
) -> Stored: ...


def offload(
    device: RankPools,
    device_geometry: KVGeometry,
    host: RankPools | DiskTier,
    host_geometry: KVGeometry | None,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
) -> HandoffResult | Stored:
    """Copy the request's KV to ``host`` (verified); the host copy is owned by the request.
    To a ``DiskTier``: published as one file (``Stored``)."""
    if isinstance(host, DiskTier):
        _no_geometry(host_geometry, "offload")
        return _offload_to_disk(
            device, device_geometry, host, request_id, token_ids, free_device, epoch
        )
    if host_geometry is None:
        raise ValueError("offload: host_geometry is None; only a DiskTier takes none")
    return _move(
        device,
        device_geometry,
        host,
        host_geometry,
        request_id,
        token_ids,
        free_source=free_device,
        epoch=epoch,
    )


def reload(
    host: RankPools | DiskTier,
    host_geometry: KVGeometry | None,
    device: RankPools,
    device_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    decode_room: int = 0,
    free_host: bool = True,
    epoch: int = 1,
) -> HandoffResult:
    """Copy the request's KV back to ``device`` (verified), with ``decode_room`` tokens.
    From a ``DiskTier``: a verified hit or ``MissError``; ``free_host`` unpublishes it."""
    if isinstance(host, DiskTier):
        _no_geometry(host_geometry, "reload")
        got = host.load(device_geometry, token_ids, request_id)
        if isinstance(got, Miss):
            raise MissError(f"{request_id!r}: {host.path(got.key).name}: {got.reason}")
        res = _move(
            got.pools,
            KVGeometry.from_manifest_source(got.manifest),
            device,
            device_geometry,
            request_id,
            token_ids,
            free_source=True,
            decode_room=decode_room,
            epoch=epoch,
            model=host.model,
        )
        if free_host:
            host.remove(got.key)
        return replace(res, checks=res.checks + got.checks)  # the file's blocks, then the copy
    if host_geometry is None:
        raise ValueError("reload: host_geometry is None; only a DiskTier takes none")
    return _move(
        host,
        host_geometry,
        device,
        device_geometry,
        request_id,
        token_ids,
        free_source=free_host,
        decode_room=decode_room,
        epoch=epoch,
    )


def _no_geometry(g: KVGeometry | None, what: str) -> None:
    if g is not None:
        raise ValueError(f"{what}: a DiskTier's file states its own geometry; pass None")


def _offload_to_disk(
    device: RankPools,
    geometry: KVGeometry,
    tier: DiskTier,
    request_id: str,
    token_ids: Sequence[int],
    free_device: bool,
    epoch: int,
) -> Stored:
    staging_geometry = geometry.with_(tp=1, layout="heads_major")
    staging = staging_geometry.make_pools(max(1, staging_geometry.blocks_for(len(token_ids))))
    res = _move(  # the device keeps its blocks until the file is published
        device,
        geometry,
        staging,
        staging_geometry,
        request_id,
        token_ids,
        free_source=False,
        epoch=epoch,
        model=tier.model,
    )
    blocks = list(res.received.blocks)
    run = blocks == list(range(blocks[0], blocks[0] + len(blocks))) if blocks else False
    kv = staging.pools[0].kv  # whole canonical blocks, in logical order (no copy: a run)
    kv = kv[blocks[0] : blocks[0] + len(blocks)] if run else kv[blocks]
    stored = tier.store(file_manifest(res.received.manifest), kv)
    if free_device:
        device.alloc.free(request_id)
    return replace(stored, checks=res.checks)
