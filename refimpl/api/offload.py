"""Verified offload and reload: a request's KV between two tiers of one worker.

Both are a ``handoff()`` over a private in-process transport, so the copy is checksummed
end to end and the pins and reservations follow the same rules as between workers. The
request keeps its own name on both tiers (no pin-name or channel convention to learn):

    off = offload(device, device_geo, host, host_geo, "req-1", token_ids, free_device=True)
    back = reload(host, host_geo, device, device_geo, "req-1", token_ids, decode_room=64)
    back.received.blocks    # the request's new device blocks; the host copy is freed

The two geometries may differ (block size, layout, TP), as in any handoff.

The host may be a ``DiskTier`` (a directory of chunk files, ``refimpl.api.disk``;
``host_geometry`` None). ``offload`` hashes each of the request's blocks once and writes
the chunk files straight from the device blocks when they are canonical (tp=1,
heads_major, CPU), else through one staging buffer the tier reuses; every chunk is flushed,
then all are renamed in order (``Stored``); ``free_device`` frees the device blocks only
once they are published. ``reload`` hits the longest stored prefix of ``token_ids``
(else ``MissError``, nothing allocated), reserves the request's device blocks (the prompt
and ``decode_room``), reads each file block straight into its device block where the
geometries agree (else through reused staging, one copy), verifies every block, and
commits (``Reloaded``: the blocks, the tokens hit); a bad block gives every reserved
block back (``MissError``). ``free_host`` unpublishes the chunks read.

``begin_offload`` / ``begin_reload`` (host pools) are the same in steps, a ``Handoff`` the
engine rounds, aborts or reads (the one-call forms run one to its end).

``offload_async`` / ``reload_async`` return a ``Transfer`` (``refimpl.tiers.transfer``):
the I/O on a thread, the blocks owned by the transfer (pinned, or reserved) until the
engine's ``poll``/``wait`` settles it on its own thread; ``cancel`` leaves nothing
half-installed. ``offload``/``reload`` to a tier are the same transfer run in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import overload

from refimpl.api.disk import DiskTier, Prefix, Stored
from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.handoff import Handoff, HandoffResult
from refimpl.api.receiver import Receiver
from refimpl.api.sender import Sender
from refimpl.rankpools import RankPools
from refimpl.tiers.host import HostTier, Kept
from refimpl.tiers.moves import Reloaded, start_offload, start_reload
from refimpl.tiers.transfer import Stepper, Transfer
from refimpl.transport import InProcessTransport
from spec.manifest import RopeConfig


def _tier_identity(g: KVGeometry) -> ModelIdentity:
    """Both tiers hold the same model's KV; the identity only has to agree with itself."""
    return ModelIdentity("local-tier", RopeConfig(10000.0, max(2, g.head_dim - g.head_dim % 2)))


def _begin(
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
    mutants: Iterable[str] = (),
    checksums: Sequence[str] | None = None,
) -> Handoff:
    t = InProcessTransport()
    model = _tier_identity(src_geometry)
    tx = Sender(src, src_geometry, t, model, mutants=mutants)
    rx = Receiver(dst, dst_geometry, t, model)
    return Handoff(
        tx, rx, request_id, token_ids, epoch=epoch, decode_room=decode_room,
        free_source=free_source, checksums=checksums,
    )  # fmt: skip


def begin_offload(
    device: RankPools,
    device_geometry: KVGeometry,
    host: RankPools,
    host_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
    mutants: Iterable[str] = (),
) -> Handoff:
    """``offload`` to host pools in steps (``Handoff``): the device blocks are frozen
    (read-only) from now on; ``round()`` until ``final``, then ``result()``; ``abort``
    (a failed store, a cancel) frees the host blocks and thaws the device ones.

    In the spec's vocabulary: this call is ``PrefillOffloadBegin``; the round that sends
    the chunks ``PrefillOffloadCopy`` of every block, the round that commits them on the
    host and frees the device blocks (``free_device``) ``PrefillOffloadCommit``; an
    ``abort`` ``EnvStoreFail`` (or a cancel's ``PrefillQuiesce``). ``mutants``: the
    offload's Sender's bug switches (``refimpl.api.switches``), for demonstrations."""
    return _begin(
        device, device_geometry, host, host_geometry, request_id, token_ids,
        free_source=free_device, epoch=epoch, mutants=mutants,
    )  # fmt: skip


def begin_reload(
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
    checksums: Sequence[str] | None = None,
) -> Handoff:
    """``reload`` from host pools in steps (``Handoff``): the request's device blocks are
    reserved at the first round (nobody reads them until the commit); ``abort`` gives
    them back and keeps the host copy. The spec's ``PrefillReloadBegin`` (this call and
    the round that reserves and sends), ``PrefillReloadCommit`` (the round that
    verifies and commits them, then frees the host copy, ``free_host``).

    ``checksums``: the host copy's, taken when its offload committed
    (``host.checksums(host.alloc.blocks_of(request_id))`` then). The device side verifies
    every block against them, so a copy whose bytes changed at rest (a lost page, a bad
    DIMM) fails the reload (``ChecksumError``: the device blocks given back, the host copy
    kept), never loads as a hit (the spec's ``HostLoadFail``). Without them the reload
    hashes the host blocks as they are now and trusts them."""
    return _begin(
        host, host_geometry, device, device_geometry, request_id, token_ids,
        free_source=free_host, decode_room=decode_room, epoch=epoch, checksums=checksums,
    )  # fmt: skip


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
    host: HostTier,
    host_geometry: None,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
) -> Kept: ...


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
    host: RankPools | DiskTier | HostTier,
    host_geometry: KVGeometry | None,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
) -> HandoffResult | Stored | Kept:
    """Copy the request's KV to ``host`` (verified); the host copy is owned by the request.
    To a ``DiskTier``: published as chunk files (``Stored``); to a ``HostTier``: held as
    chunks under the same prefix keys (``Kept``)."""
    if isinstance(host, HostTier):
        _no_geometry(host_geometry, "offload")
        return host.put(device, device_geometry, request_id, token_ids, free_device=free_device)
    if isinstance(host, DiskTier):
        _no_geometry(host_geometry, "offload")
        return start_offload(
            device, device_geometry, host, request_id, token_ids,
            free_device=free_device, epoch=epoch, background=False,
        ).wait()  # fmt: skip
    if host_geometry is None:
        raise ValueError("offload: host_geometry is None; only a DiskTier takes none")
    return begin_offload(
        device, device_geometry, host, host_geometry, request_id, token_ids,
        free_device=free_device, epoch=epoch,
    ).run()  # fmt: skip


@overload
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
    checksums: Sequence[str] | None = None,
) -> HandoffResult: ...


@overload
def reload(
    host: HostTier,
    host_geometry: None,
    device: RankPools,
    device_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    decode_room: int = 0,
    free_host: bool = True,
    epoch: int = 1,
    blocks: Sequence[int] | None = None,
) -> Reloaded: ...


@overload
def reload(
    host: DiskTier,
    host_geometry: None,
    device: RankPools,
    device_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    decode_room: int = 0,
    free_host: bool = True,
    epoch: int = 1,
    blocks: Sequence[int] | None = None,
) -> Reloaded: ...


def reload(
    host: RankPools | DiskTier | HostTier,
    host_geometry: KVGeometry | None,
    device: RankPools,
    device_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    decode_room: int = 0,
    free_host: bool = True,
    epoch: int = 1,
    blocks: Sequence[int] | None = None,
    checksums: Sequence[str] | None = None,
) -> HandoffResult | Reloaded:
    """Copy the request's KV back to ``device`` (verified), with ``decode_room`` tokens.
    From a ``DiskTier``: the longest stored prefix, verified (``Reloaded``), else
    ``MissError``; ``free_host`` unpublishes the chunks read; ``blocks``: the engine's
    block ids for the request (registered memory: ``register_kv_caches``), the hit read
    straight into them. From a ``HostTier``: the same, from its chunks. From host pools:
    ``checksums`` as ``begin_reload``'s (a DiskTier's files hold their own)."""
    if isinstance(host, HostTier | DiskTier) and checksums is not None:
        raise ValueError("reload: a tier's chunks hold their checksums; pass none")
    if isinstance(host, HostTier):
        _no_geometry(host_geometry, "reload")
        return host.get(
            device, device_geometry, request_id, token_ids,
            decode_room=decode_room, free_host=free_host, epoch=epoch, blocks=blocks,
        )  # fmt: skip
    if isinstance(host, DiskTier):
        _no_geometry(host_geometry, "reload")
        return start_reload(
            host, device, device_geometry, request_id, token_ids,
            decode_room=decode_room, free_host=free_host, epoch=epoch, background=False,
            blocks=blocks,
        ).wait()  # fmt: skip
    if blocks is not None:
        raise ValueError("reload: blocks= is for a DiskTier (host pools: Receiver.expect)")
    if host_geometry is None:
        raise ValueError("reload: host_geometry is None; only a DiskTier takes none")
    return begin_reload(
        host, host_geometry, device, device_geometry, request_id, token_ids,
        decode_room=decode_room, free_host=free_host, epoch=epoch, checksums=checksums,
    ).run()  # fmt: skip


def _no_geometry(g: KVGeometry | None, what: str) -> None:
    if g is not None:
        raise ValueError(f"{what}: a tier's chunk states its own geometry; pass None")


def offload_async(
    device: RankPools,
    device_geometry: KVGeometry,
    tier: DiskTier,
    request_id: str,
    token_ids: Sequence[int],
    *,
    free_device: bool = False,
    epoch: int = 1,
    stepper: Stepper | None = None,
) -> Transfer[Stored, Stored]:
    """``offload`` to ``tier`` in the background: poll, wait or cancel the handle. The
    request's blocks are pinned (read-only) until it is settled. ``stepper``: a test's
    hold on the I/O thread (``refimpl.tiers.transfer.Stepper``)."""
    return start_offload(
        device, device_geometry, tier, request_id, token_ids,
        free_device=free_device, epoch=epoch, stepper=stepper,
    )  # fmt: skip


def reload_async(
    tier: DiskTier,
    device: RankPools,
    device_geometry: KVGeometry,
    request_id: str,
    token_ids: Sequence[int],
    *,
    decode_room: int = 0,
    free_host: bool = True,
    epoch: int = 1,
    blocks: Sequence[int] | None = None,
    prefix: Prefix | None = None,
    stepper: Stepper | None = None,
) -> Transfer[int, Reloaded]:
    """``reload`` from ``tier`` in the background. A miss raises ``MissError`` here,
    before anything is reserved; the reserved blocks belong to the transfer until it is
    settled (committed to the request, or given back on a bad block or a cancel).
    ``prefix``: the engine's pinned lookup (``tier.open_prefix``), read as it is (the
    transfer's once this returns); ``stepper``: a test's hold on the I/O thread."""
    return start_reload(
        tier, device, device_geometry, request_id, token_ids,
        decode_room=decode_room, free_host=free_host, epoch=epoch, blocks=blocks,
        prefix=prefix, stepper=stepper,
    )  # fmt: skip
