"""The API's part of the spec's state (``spec.state.Req``), read from real ends.

``tier_part`` reads a request's offload/reload (``refimpl.api.offload``) and host copy;
``host_cache_part`` the shared host cache (a ``DiskTier``: the world's globals).
``sender_part(senders, rid, per_rank)`` reads the Senders of one request, one per prefill
TP rank, and ``receiver_part(rx, rid, per_rank)`` the decode side's Receiver; each returns
the ``Req`` fields it owns (the router's status, the messages in flight and the globals
are the caller's: ``refimpl.testing.api_adapter``). Read only: nothing here changes an
end.

    ep      the attempt's epoch, the same on every rank (else ``RankDisagreement``)
    rinc    the incarnation of the receiver whose Ready the attempt took (its writes'
            target; a new offer starts from the last one's)
    ps      no attempt / a final one IDLE; OFFERED AWAIT_READY; SENDING with every layer
            and seal out AWAIT_ACK (SENDING before that: some layer not computed yet)
    sent    items sent in the phase (chunks and seals, rank-major): all of them once sealed
    phit    past the receiver's Ready (SENDING, AWAIT_ACK): the prefix blocks the offer
            does not send (its manifest's ``prefix_blocks``, which the Receiver took),
            else 0
    nack    a Nack the Senders read while their writes were pending (``Sender._resume``):
            the spec's Nack still in the net, not taken by ``PrefillResume`` yet (its
            code, 0 if none)
    p       (with ``held``) no blocks NONE; an attempt in progress COMPLETE (the source
            is the attempt's, read-only); else WRITABLE
    d       decode: no attempt NONE; RECEIVING with nothing landed RESERVED, else FILLING;
            DONE with the request's blocks still held WRITABLE (the engine owns them)
    dep     the newest attempt's epoch the receiver has taken
    hit     while d is not NONE, the prefix blocks the attempt holds a reference to and
            did not receive (``expect(prefix=...)``: the manifest's ``prefix_blocks``)
    landed  chunk (rank, j) whose every layer is installed, j the sent block's index
            after the prefix: bit rank * (m - hit) + j
    rmask   ranks whose seal the receiver holds
    dfl     the ended attempt's error: a checksum DF_CORRUPT (| DF_FENCED while other
            chunks were still to land), a manifest DF_MISMATCH | DF_FENCED, the
            receiver's own timeout DF_FENCED, its ``abort`` DF_FENCED while chunks were
            still to land (a manifest refused at intake leaves no attempt: the spec's
            DecodeReject, dfl 0, dep its epoch); the engine's ``fail`` DF_FAILED (|
            DF_FENCED while chunks were still to land). On an unrevocable transport
            (``unrevocable.quarantine``) an attempt given up while chunks were still to land is
            QUARANTINED (landed: with the writes that landed since), never DF_FENCED,
            until the writer's Quiesced; a late bad write adds DF_CORRUPT
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from refimpl.api.disk import DiskTier, Prefix
from refimpl.api.geometry import KVGeometry
from refimpl.api.handoff import Handoff
from refimpl.api.intake import chunks_left
from refimpl.api.receiver import Receiver
from refimpl.api.sender import Sender
from refimpl.api.wire import State
from refimpl.blocks import BlockAllocator
from refimpl.errors import ChecksumError, DecodeFailedError, ManifestError
from refimpl.tiers.files import TEMP_SUFFIX, read_header
from refimpl.tiers.kvio import checksum, read_into
from refimpl.tiers.validate import TENSOR, parse_manifest
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    DF_CORRUPT,
    DF_FAILED,
    DF_FENCED,
    DF_MISMATCH,
    FILLING,
    IDLE,
    M_NACK,
    NONE,
    QUARANTINED,
    RESERVED,
    SENDING,
    WRITABLE,
    msg,
)

__all__ = ["RankDisagreement", "prefix_part", "receiver_part", "sender_part", "tier_part"]

TIMEOUT_REASON = "timeout"  # the reason the decode side gives its own timeout's abort


class RankDisagreement(AssertionError):
    """The prefill ranks' Senders are not in one attempt (epoch or phase differ)."""


def _offer(s: Sender, rid: str) -> Any:
    return s._offers.get(rid)  # noqa: SLF001 - a refinement map reads the end's state


def sender_part(senders: Sequence[Sender], rid: str, per_rank: int) -> dict[str, int]:
    """ep, ps, sent, rinc and whether an attempt is in progress (``live``) of ``rid``."""
    views = []
    for s in senders:
        o = _offer(s, rid)
        if o is None:
            views.append((0, IDLE, 0, 0, 0, 0))
            continue
        nack = 0 if o.nacked is None else msg(M_NACK, o.epoch, 0, o.nacked[2])
        pre = o.manifest.prefix_blocks  # not sent: the receiver holds them
        if o.state.final:
            views.append((o.epoch, IDLE, 0, o.rinc, nack, 0))
        elif o.state is State.OFFERED:
            views.append((o.epoch, AWAIT_READY, 0, o.rinc, nack, 0))
        elif o.stream is not None and o.stream.sealed:
            sent = len(senders) * (per_rank - pre + 1)
            views.append((o.epoch, AWAIT_ACK, sent, o.rinc, nack, pre))
        else:
            views.append((o.epoch, SENDING, 0, o.rinc, nack, pre))
    if len(set(views)) > 1:
        raise RankDisagreement(f"{rid!r}: the prefill ranks' attempts differ: {views}")
    ep, ps, sent, rinc, nack, phit = views[0] if views else (0, IDLE, 0, 0, 0, 0)
    out = {"ep": ep, "ps": ps, "sent": sent, "live": int(ps != IDLE), "rinc": rinc}
    return {**out, "nack": nack, "phit": phit}


def prefill_replica(held: bool, live: bool) -> int:
    """p from whether the request holds blocks and an attempt is in progress."""
    return NONE if not held else COMPLETE if live else WRITABLE


def tier_part(
    move: tuple[str, Handoff] | None, host_held: bool, device_held: bool, per_rank: int
) -> dict[str, int]:
    """h, hl, gl and, while a move is in progress, p of a request with a host tier:
    ``move`` its offload or reload (``refimpl.api.offload.begin_offload``/``begin_reload``,
    a ``Handoff``) as ("offload" | "reload", handoff), ``host_held``/``device_held``
    whether it holds blocks in the host pools / the device pools. A move's blocks are
    copied (``hl``/``gl``) once its Sender sent their chunks (all at once, on the ready).

        h   an offload in progress FILLING; else the host pools hold it COMPLETE; else NONE
        hl  an offload's blocks copied; a host copy's every block; else 0
        gl  a reload's blocks copied, else 0
        p   an offload in progress: COMPLETE while the device blocks are held (read-only:
            the offload's snapshot), NONE once freed; a reload in progress FILLING (its
            device blocks reserved, the request's only at the commit)"""
    out = {"h": COMPLETE if host_held else NONE, "hl": per_rank if host_held else 0, "gl": 0}
    if move is None or move[1].final:
        return out
    kind, h = move
    o = _offer(h.sender, h.request_id)
    sent = per_rank if o is not None and o.chunks else 0
    if kind == "offload":
        out.update(h=FILLING, hl=sent, p=COMPLETE if device_held else NONE)
    else:
        out.update(gl=sent, p=FILLING)
    return out


def receiver_part(rx: Receiver, rid: str, per_rank: int) -> dict[str, int]:
    """d, dep, hit, landed, rmask, dfl of ``rid`` on the decode side (``per_rank``: the
    request's blocks per source rank, its prefix included)."""
    a = rx._att.get(rid)  # noqa: SLF001 - a refinement map reads the end's state
    refused = rx._fenced.get(rid, 0)  # noqa: SLF001 - the newest epoch refused at intake
    out = {"d": NONE, "dep": refused, "hit": 0, "landed": 0, "rmask": 0, "dfl": 0}
    if a is None or a.m.epoch < refused:  # nothing taken yet, or refused at intake
        return out
    out["dep"] = a.m.epoch
    per_rank -= a.m.prefix_blocks  # the chunks are the sent blocks': after the prefix
    late = rx._late.get(rid)  # noqa: SLF001 - a quarantine (an unrevocable transport)
    late = late if late is not None and late.epoch == a.m.epoch else None
    if a.state is State.RECEIVING or (late is not None and late.held):
        landed, out["rmask"] = _landed(a, per_rank)
        for r, idx in late.chunks if late is not None else ():
            landed |= 1 << (r * per_rank + idx - a.m.prefix_blocks)
        out["landed"] = landed
        partial = bool(a.landed) if a.stream is None else bool(a.stream.landed)
        out["d"] = FILLING if partial else RESERVED
        if a.state is not State.RECEIVING:
            out["d"] = QUARANTINED
    elif a.state is State.DONE and rx.pools.alloc.blocks_of(rid):
        out["d"] = WRITABLE
        out["landed"] = (1 << (len(a.ranks) * per_rank)) - 1
        out["rmask"] = (1 << len(a.ranks)) - 1
    if out["d"] != NONE:  # a replica here: it holds its prefix (the spec drops it with d)
        out["hit"] = a.m.prefix_blocks
    if a.state is State.ABORTED:
        e = a.error
        left = chunks_left(a)  # chunks not (wholly) landed
        if isinstance(e, DecodeFailedError):  # Receiver.fail: DecodeFail, then its abort
            out["dfl"] = DF_FAILED | (DF_FENCED if left else 0)
        elif isinstance(e, ChecksumError):  # fenced unless the bad chunk was the last one
            out["dfl"] = DF_CORRUPT | (DF_FENCED if left > 1 else 0)
        elif isinstance(e, ManifestError):
            out["dfl"] = DF_MISMATCH | DF_FENCED
        elif e is not None and str(e).endswith(f"aborted by the receiver: {TIMEOUT_REASON}"):
            out["dfl"] = DF_FENCED
        elif e is not None and "aborted by the receiver: " in str(e) and left:
            out["dfl"] = DF_FENCED  # the scheduler's abort while writes may land: fenced
        if late is not None:  # quarantined, not fenced; a late write may have been bad
            out["dfl"] = out["dfl"] & ~DF_FENCED | (DF_CORRUPT if late.corrupt else 0)
    return out


def prefix_part(alloc: BlockAllocator, blocks: Sequence[int]) -> dict[str, int]:
    """pfx and pfx_ref of a decode-side prefix cache whose own reference is on ``blocks``
    (none: evicted, or never cached): the references other holders (the requests whose
    attempts took it, ``Receiver.expect(prefix=...)``) have on them, read from the
    allocator's refcounts; blocks whose counts differ are not one prefix (raises)."""
    refs = {alloc.refcount(b) - 1 for b in blocks}
    if len(refs) > 1:
        raise AssertionError(f"prefix blocks {list(blocks)}: references differ {sorted(refs)}")
    return {"pfx": bool(blocks), "pfx_ref": refs.pop() if refs else 0}


def _landed(a: Any, per_rank: int) -> tuple[int, int]:
    """(landed, rmask) of an attempt: chunks (rank, block) whose every layer is installed,
    ranks whose seal is held."""
    landed, s = 0, a.stream
    if s is None:
        for r, idx in a.landed:
            landed |= 1 << (r * per_rank + idx - a.m.prefix_blocks)
        return landed, 0
    for r in s.ranks:
        for j in range(s.num_blocks):
            if all((r, j, k) in s.landed for k in range(s.num_layers)):
                landed |= 1 << (r * per_rank + j)
    return landed, sum(1 << r for r in s.seals)


def host_cache_part(
    tier: DiskTier,
    geometry: KVGeometry,
    token_ids: Sequence[int],
    readers: Sequence[Prefix],
    storing: bool,
) -> dict[str, Any]:
    """The spec's shared host cache (``hc``, ``hc_hl``, ``hc_pin``, ``hc_late``,
    ``hc_bad``: spec/behaviours/host_cache.py) from a ``DiskTier`` holding ``token_ids``
    as one chunk; ``readers`` the lookups and loads the engine holds open, ``storing``
    a store of the key in flight (its ``Transfer`` not settled).

        hc      a store in flight FILLING; a lookup hits COMPLETE; else read (pinned)
                QUARANTINED; else NONE (unlinked at its last reader: HostFree)
        hc_hl   the copy's blocks once its temp file is written or it is visible or read
        hc_pin  the tier's readers of the key (``DiskTier.pinned``)
        hc_late 0: a cancelled store's writer is joined by the cancel itself
        hc_bad  some block of the copy (the published file, else a reader's open one)
                does not hash to its manifest's checksum"""
    key, blocks = tier.key(geometry, token_ids), geometry.blocks_for(len(token_ids))
    temp = any(n.endswith(TEMP_SUFFIX) for n in os.listdir(tier.directory))
    if storing:
        hc, hl = FILLING, blocks if temp else 0
    elif tier.lookup(geometry, token_ids) == len(token_ids):
        hc, hl = COMPLETE, blocks
    elif tier.pinned(key):
        hc, hl = QUARANTINED, blocks
    else:
        hc, hl = NONE, 0
    bad = hc in (COMPLETE, QUARANTINED) and not _copy_whole(tier, key, readers)
    return {"hc": hc, "hc_hl": hl, "hc_pin": tier.pinned(key), "hc_late": 0, "hc_bad": bad}


def _copy_whole(tier: DiskTier, key: str, readers: Sequence[Prefix]) -> bool:
    """Every block of ``key``'s copy hashes to its checksum (read with ``pread``: no
    reader's file position moves)."""
    try:
        with open(tier.path(key), "rb") as f:
            header = read_header(f)
            return _blocks_whole(f, header, parse_manifest(header).block_checksums)
    except FileNotFoundError:
        pass
    for p in readers:
        for c in p.chunks:
            if c.key == key and not c.file.closed:
                return _blocks_whole(c.file, c.header, c.manifest.block_checksums)
    return True


def _blocks_whole(f: Any, header: Any, sums: Sequence[str]) -> bool:
    e = header.entries[TENSOR]
    n = (e.end - e.begin) // max(1, len(sums))
    for i, want in enumerate(sums):
        buf = bytearray(n)
        read_into(f, header, TENSOR, [memoryview(buf)], offset=i * n)
        if checksum([memoryview(buf)]) != want:
            return False
    return True
