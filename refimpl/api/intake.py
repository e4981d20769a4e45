"""The receiver's intake of a manifest: one attempt's record, checked and reserved.

``accept`` parses the peer's manifest message (hostile input), applies
``check_compatible`` against the receiver's ``LocalConfig``, checks the prefix held here
against the manifest's first token ids, reserves the target blocks, checks the staging
copy (another block size) against this side's pool (``CapacityError``) and only then
allocates it. It raises on any refusal and keeps nothing; ``Receiver`` answers the nack.

A streamed offer (``"layers": L`` in the message, ``Sender.offer(..., layers=L)``) is
sent before its KV exists: its chunks are one (rank, layer) each, holding that layer of
a run of sent blocks (all of them unless the sender splits it), and every source rank's
``seal`` lists the chunks it sent with their checksums (``refimpl.api.layers``). ``"ranked": true``
says that each source rank is its own ``Sender`` (one process per rank), so the replies
go to every source rank's channel.

Writes that cannot be taken back (spec ``Config.revocable=False``): an attempt given up
while a write may still land is quarantined till its writers' Quiesced
(``refimpl.api.unrevocable.quarantine``); a manifest that comes meanwhile waits (``on_manifest``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from refimpl.api import wire
from refimpl.api.geometry import KVGeometry
from refimpl.api.layers import LayerStream, rank_pieces
from refimpl.api.switches import PREFIX_UNREFERENCED
from refimpl.api.wire import ABORT, NACK, READY, State
from refimpl.errors import (
    CancelledError,
    CapacityError,
    ChunkError,
    InUseError,
    ManifestError,
    OwnershipError,
)
from refimpl.memory.views import Landing
from refimpl.pool import PoolGeometry
from refimpl.rankpools import RankPools
from spec import shardmap as sm
from spec.manifest import LocalConfig, Manifest, check_compatible
from spec.manifest import ManifestError as SpecManifestError
from spec.manifest import from_json_dict as manifest_from_json
from spec.manifest_fields import MAX_PARALLEL

if TYPE_CHECKING:
    from refimpl.api.receiver import Receiver


@dataclass
class Expect:
    decode_room: int = 0  # tokens of room to reserve after the prompt
    prefix: tuple[int, ...] = ()  # blocks held here (own block size) that are not sent
    prefix_tokens: tuple[int, ...] = ()  # the token ids whose KV those blocks hold
    blocks: tuple[int, ...] | None = None  # the engine's destination blocks (registered)


@dataclass
class Attempt:
    m: Manifest
    target: list[int]  # prefix + reserved blocks, logical order, own block size
    prefix: int  # how many of ``target`` are prefix blocks (not written)
    src: KVGeometry  # the sender's geometry
    ranks: list[int]  # source primaries: one chunk per (rank, sent block)
    pieces: Mapping[int, Sequence[sm.HeadPiece]]  # source rank -> its pieces of the plan
    staging: RankPools | None  # sender's geometry, when the block size differs
    stream: LayerStream | None = None  # a streamed offer: chunks per layer, seals per rank
    ranked: bool = False  # one Sender per source rank: replies go to each rank's channel
    state: State = State.RECEIVING
    landed: set[tuple[int, int]] = field(default_factory=set)  # (rank, block index) installed
    verified: set[int] = field(default_factory=set)  # block indices already end-to-end
    error: OwnershipError | None = None
    stale: int = 0
    duplicates: int = 0
    checks: int = 0  # checksum comparisons that passed (per chunk, per block end to end)
    staged: int = 0  # bytes of the staging copy (0 without one)
    unstaged: set[int] = field(default_factory=set)  # layers copied from staging to targets
    spans: dict[tuple[int, int], Landing | None] = field(default_factory=dict)  # (dst rank,
    # layer or -1 for whole blocks) -> where chunks land as they are (``install._landing``)
    src_pool: PoolGeometry | None = None  # ``src``'s per-rank block geometry (made once)


def newer(header: Mapping[str, Any], a: Attempt | None, fenced: int = 0) -> bool:
    """A manifest starts an attempt unless one of this or a later epoch already ran, or
    was refused at intake (``fenced``: a copy of a refused manifest is not judged again)."""
    mf = header.get("manifest")
    epoch = wire.epoch_of(mf) if isinstance(mf, dict) else None
    if epoch is not None and epoch <= fenced:
        return False
    return a is None or (epoch is not None and epoch > a.m.epoch)


def on_manifest(rx: Receiver, rid: str, header: Mapping[str, Any], a: Attempt | None) -> None:
    """A manifest with no live attempt here: a newer one is checked and reserved (``accept``)
    and answered ``ready``, else refused with a ``nack`` alone and its epoch fenced;
    an older one (or a copy of a refused one) is dropped unread."""
    if not newer(header, a, rx._fenced.get(rid, 0)):
        return
    late = rx._late.get(rid)
    if late is not None and late.held:  # the spec's DecodeReserve/Reject wait for d none:
        old = late.manifest.get("manifest") if late.manifest is not None else None
        if late.manifest is None or newer(header, None, wire.epoch_of(old or {}) or 0):
            late.manifest = dict(header)  # taken once the quarantine is over (``deferred``)
        return
    if not rx.pools.alloc.blocks_of(rid):  # an ended attempt whose blocks are gone:
        rx._att.pop(rid, None)  # this one replaces its record (else it is refused,
        # and the committed attempt the engine still holds stays what state() answers)
    mf = header.get("manifest")
    epoch = wire.epoch_of(mf) if isinstance(mf, dict) else None
    try:
        early = rx._aborted.get(rid)
        if early is not None and epoch is not None and epoch <= early[0]:
            raise CancelledError(f"sender aborted before its manifest was read: {early[1]}")
        if rid in rx._ends:  # the scheduler ended it: the spec's DecodeReject
            raise CancelledError(f"{rid!r} has ended here: {rx._ends[rid]}")
        new = accept(rx, rid, header, rx._expect.get(rid, Expect()))
    except Exception as e:  # a peer's message: every failure is a nack, never raised
        if not isinstance(e, OwnershipError):
            e = CapacityError(f"{rid!r}: manifest not taken: {type(e).__name__}: {e}")
        rx._errors[rid] = e
        if epoch is not None:  # refused: a copy of this epoch is not judged again
            rx._fenced[rid] = max(epoch, rx._fenced.get(rid, 0))
        rx._ended_now(rid)
        reasons = e.reasons if isinstance(e, SpecManifestError) else [str(e)]
        for to in reply_channels(rid, header):
            nack = {"type": NACK, "epoch": epoch, "reasons": reasons}
            send_quietly(rx.transport, to, wire.stamp(nack, rx.inc.own))
        return
    rx._att[rid] = new
    rx._errors.pop(rid, None)
    rx._aborted.pop(rid, None)
    if failed := rx._send(rid, {"type": READY, "epoch": new.m.epoch}):
        rx._fail(new, ChunkError(f"{rid!r}: {failed}", prop="RankAgreement"))


def early_abort(rx: Receiver, rid: str, header: Mapping[str, Any], a: Attempt | None) -> None:
    """A sender's abort with no live attempt here: if it is newer than any attempt
    seen, keep it (bounded), so its manifest, if it comes later, is refused."""
    e = wire.epoch_of(header)
    if e is None or (a is not None and e <= a.m.epoch):
        return
    rx._aborted[rid] = (e, wire.reasons_of(header))
    rx._ended_now(rid)


def aborting_ranks(msgs: Sequence[tuple[Any, Any]], a: Attempt) -> frozenset[int]:
    """The source ranks whose own abort of ``a`` is among ``msgs``: they need no nack
    (the receiver's answer to an abort goes to the sibling ranks that have not said it)."""
    out = set()
    for header, _ in msgs:
        if not isinstance(header, dict) or header.get("type") != ABORT:
            continue
        rank = header.get("rank")
        if wire.epoch_of(header) == a.m.epoch and type(rank) is int and rank in a.ranks:
            out.add(rank)
    return frozenset(out)


def reply_channels(rid: str, header: Mapping[str, Any]) -> list[str]:
    """Where the answer to a manifest message goes (every rank's channel when ranked)."""
    mf = header.get("manifest")
    tp = mf.get("src_tp") if isinstance(mf, dict) else None
    if header.get("ranked") is True and type(tp) is int and 1 <= tp <= MAX_PARALLEL:
        return [wire.channels(rid).to_rank(r) for r in range(tp)]
    return [wire.channels(rid).to_sender]


def tos(a: Attempt, skip: frozenset[int] = frozenset()) -> list[str]:
    """The channels of an attempt's sender: every rank's (but ``skip``) when ranked."""
    ch = wire.channels(a.m.request_id)
    if not a.ranked:
        return [ch.to_sender]
    return [ch.to_rank(r) for r in range(a.m.src_tp) if r not in skip]


def send_quietly(transport: Any, channel: str, header: Mapping[str, Any]) -> str:
    """Send one message; returns why it failed ("" if sent). A peer's message must never
    make the receiver raise (a ranked manifest on a one-rank route, a closed link)."""
    try:
        transport.send(channel, header)
    except Exception as e:
        return f"reply on {channel!r} not sent: {type(e).__name__}: {e!s:.200}"
    return ""


def manifest_gate(obj: object, local: LocalConfig) -> tuple[Manifest, tuple[str, ...]]:
    """A peer's manifest, parsed (spec ``from_json_dict``: ``SpecManifestError`` naming
    what is malformed), and every reason ``check_compatible`` refuses it on a side running
    ``local`` (empty: compatible). The one gate of the ``Receiver``'s intake and of the
    reference engine's decode (``manifest_refusals``)."""
    m = manifest_from_json(obj)
    return m, tuple(check_compatible(m, local).reasons)


def accept(rx: Receiver, rid: str, header: Mapping[str, Any], ex: Expect) -> Attempt:
    """Check and reserve; raises the refusal (nothing kept)."""
    try:
        m, why = manifest_gate(header.get("manifest"), rx.local)
    except SpecManifestError as e:
        raise ManifestError.from_spec(e) from None
    reasons = list(why) if rx.manifest_gate else []
    if m.request_id != rid:
        reasons.append(f"request_id: {m.request_id!r} on the channel of {rid!r}")
    if m.src_cp != 1:
        reasons.append(f"src_cp: {m.src_cp}; this receiver takes cp=1 senders only")
    layers = header.get("layers")
    if layers is not None and (type(layers) is not int or layers != m.num_layers):
        reasons.append(f"layers: {layers!r}; a streamed offer sends all {m.num_layers} layers")
    g, alloc = rx.geometry, rx.pools.alloc
    pre_tokens = m.prefix_blocks * m.block_size
    if pre_tokens != len(ex.prefix) * g.block_size:
        reasons.append(
            f"prefix_blocks: {m.prefix_blocks} x {m.block_size} tokens, but "
            f"{len(ex.prefix)} x {g.block_size} are held here"
        )
    elif m.token_ids[: len(ex.prefix_tokens)] != ex.prefix_tokens:
        pairs = zip(m.token_ids, ex.prefix_tokens, strict=False)
        at = next((i for i, (x, y) in enumerate(pairs) if x != y), len(m.token_ids))
        reasons.append(
            f"prefix_tokens: the {len(ex.prefix)} prefix blocks held here hold other "
            f"tokens than the manifest's first {len(ex.prefix_tokens)} (from token {at})"
        )
    if reasons:
        raise ManifestError(reasons)
    if alloc.blocks_of(rid):
        raise InUseError(f"{rid!r} already holds blocks {alloc.blocks_of(rid)} here")
    src = KVGeometry.from_manifest_source(m)
    need = sm.blocks_needed(m.num_tokens + ex.decode_room, g.block_size) - len(ex.prefix)
    stage = m.block_size != g.block_size or rx.stage
    staged = len(m.sent_blocks) * src.rank_pool_geometry().block_bytes * src.tp
    if PREFIX_UNREFERENCED not in rx.mutants:  # (the bug reads them unreferenced)
        alloc.incref(rid, ex.prefix)  # refuses a prefix block that is not valid here
    staging = None
    try:
        if ex.blocks is None:
            own = alloc.reserve(rid, max(0, need), epoch=m.epoch)
        elif len(ex.blocks) < need:
            raise CapacityError(
                f"{rid!r}: {len(ex.blocks)} destination blocks given for {m.num_tokens} "
                f"tokens ({need} blocks of {g.block_size} after the prefix)"
            )
        else:  # the scheduler's blocks, every one reserved for this attempt
            own = alloc.reserve_ids(rid, ex.blocks, epoch=m.epoch)
        in_use = rx.staged_bytes()  # every live attempt's staging, in total
        if stage and staged + in_use > rx.pool_bytes:  # checked before anything is allocated
            raise CapacityError(
                f"staging {staged} bytes (+ {in_use} staged by other attempts) > the pool's "
                f"{rx.pool_bytes}"
            )
        if stage:  # checked and reserved: only now allocated
            staging = src.make_pools(max(1, len(m.sent_blocks)))
            staging.alloc.reserve(rid, len(m.sent_blocks), epoch=m.epoch)
    except Exception:  # give back the prefix references and the reservation just taken
        alloc.quarantine(rid)  # nothing was written: free at once
        alloc.unquarantine_and_free(rid, m.epoch)
        raise
    pieces = rank_pieces(m.kv_heads, m.src_tp, g.tp)  # the primaries' (``layers.source_of``)
    ranks = list(pieces)
    stream = LayerStream(m.num_layers, ranks, len(m.sent_blocks)) if layers is not None else None
    ranked = header.get("ranked") is True
    a = Attempt(m, [*ex.prefix, *own], len(ex.prefix), src, ranks, pieces, staging, stream, ranked)
    a.staged = staged if staging is not None else 0
    return a


# ------------------------------------------------------------ unrevocable writes
def revocable(transport: object) -> bool:
    """Can the transport take a posted write back (``revocable``, True if it does not say)?"""
    return bool(getattr(transport, "revocable", True))


def chunks_left(a: Attempt) -> int:
    """The attempt's chunks (one per source rank and sent block, every layer of it) not
    wholly landed here."""
    s = a.stream
    whole = (
        len(a.landed)
        if s is None
        else sum(
            all((r, j, k) in s.landed for k in range(s.num_layers))
            for r in s.ranks
            for j in range(s.num_blocks)
        )
    )
    return len(a.ranks) * len(a.m.sent_blocks) - whole
