"""Verified offload and reload: a request's KV between two tiers of one worker.

Both are a ``handoff()`` over a private in-process transport, so the copy is checksummed
end to end and the pins and reservations follow the same rules as between workers. The
request keeps its own name on both tiers (no pin-name or channel convention to learn):

    off = offload(device, device_geo, host, host_geo, "req-1", token_ids, free_device=True)
    back = reload(host, host_geo, device, device_geo, "req-1", token_ids, decode_room=64)
    back.received.blocks    # the request's new device blocks; the host copy is freed

The two geometries may differ (block size, layout, TP), as in any handoff.
"""

from __future__ import annotations

from collections.abc import Sequence

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.handoff import HandoffResult, handoff
from refimpl.api.receiver import Receiver
from refimpl.api.sender import Sender
from refimpl.engine.data import RankPools
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
) -> HandoffResult:
    t = InProcessTransport()
    model = _tier_identity(src_geometry)
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
) -> HandoffResult:
    """Copy the request's KV to ``host`` (verified); the host copy is owned by the request."""
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
    host: RankPools,
    host_geometry: KVGeometry,
    device: RankPools,
    device_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    decode_room: int = 0,
    free_host: bool = True,
    epoch: int = 1,
) -> HandoffResult:
    """Copy the request's KV back to ``device`` (verified), with ``decode_room`` tokens."""
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
