"""``Receiver``: the destination end of a handoff; it cannot commit what it did not install.

    rx = Receiver(pools, geometry, transport, model)     # geometry checked against pools
    rx.expect("req-1", decode_room=64)                   # optional: room, prefix held here
    while not rx.state("req-1").final: rx.poll("req-1")  # WAITING until the manifest
    got = rx.result("req-1")                             # Received, or raises why not

On the manifest: parse (hostile input), ``check_compatible`` against this side's
``LocalConfig``, the prefix held here against the manifest's first token ids, reserve
the target blocks, the staging copy (another block size) no larger than this side's
pool (``CapacityError``), and only then allocate it. Any refusal or failure answers
``nack`` with the reasons and keeps nothing; ``poll`` never raises on a peer's message.

Per chunk: request + epoch (an int, else fenced and counted), rank and index, the payload
size, xxh3(payload) == the header's (else ``ChecksumError`` naming block and rank), then
the install; only once it returned is the chunk counted. Same block size on both sides:
it lands straight in its target block (TP heads and axis order by ``land_shard``); else
in a private staging copy of the sender's geometry, resharded into the targets at the end.

At the end: every canonical block (all heads, heads_major) hashes to the manifest's
checksum (else ``ChecksumError``), then commit (RESERVED -> OWNED) and ``ack``. Any
failure after the reservation aborts: the reserved blocks go back to the pool (quarantine,
then free: installs are synchronous), chunks in flight are dropped, and the sender gets a
``nack`` naming the error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from refimpl.api import wire
from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.wire import ABORT, ACK, CHUNK, MANIFEST, NACK, READY, State, channels
from refimpl.checksum import block_checksum, bytes_checksum
from refimpl.engine.data import RankPools, land_shard
from refimpl.errors import (
    CancelledError,
    CapacityError,
    ChecksumError,
    ChunkError,
    InUseError,
    ManifestError,
    OwnershipError,
)
from refimpl.reshard import ShardedKV, reshard
from refimpl.transport import Payload, Transport
from spec import shardmap as sm
from spec.manifest import Manifest, check_compatible
from spec.manifest import ManifestError as SpecManifestError
from spec.manifest import from_json_dict as manifest_from_json


@dataclass(frozen=True, slots=True)
class Received:
    """A committed handoff: the request now owns ``blocks`` here (logical order)."""

    request_id: str
    blocks: tuple[int, ...]  # prefix blocks, then the received ones, then decode room
    num_tokens: int
    manifest: Manifest


@dataclass
class _Expect:
    decode_room: int = 0  # tokens of room to reserve after the prompt
    prefix: tuple[int, ...] = ()  # blocks held here (own block size) that are not sent
    prefix_tokens: tuple[int, ...] = ()  # the token ids whose KV those blocks hold


@dataclass
class _Attempt:
    m: Manifest
    target: list[int]  # prefix + reserved blocks, logical order, own block size
    prefix: int  # how many of ``target`` are prefix blocks (not written)
    src: KVGeometry  # the sender's geometry
    ranks: list[int]  # source primaries: one chunk per (rank, sent block)
    pieces: dict[int, list[sm.HeadPiece]]  # source rank -> its pieces of the TP plan
    staging: RankPools | None  # sender's geometry, when the block size differs
    state: State = State.RECEIVING
    landed: set[tuple[int, int]] = field(default_factory=set)  # (rank, block index) installed
    verified: set[int] = field(default_factory=set)  # block indices already end-to-end
    error: OwnershipError | None = None
    stale: int = 0
    duplicates: int = 0
    checks: int = 0  # checksum comparisons that passed (per chunk, per block end to end)


class Receiver:
    """The destination side: validates, reserves, installs, verifies, commits or aborts."""

    def __init__(
        self,
        pools: RankPools,
        geometry: KVGeometry,
        transport: Transport,
        model: ModelIdentity,
        *,
        stage: bool = False,
        disabled_guards: Iterable[str] = (),
    ) -> None:
        """``stage``: land every chunk in staging, so that the target blocks are written
        only after every block verified (else only a block-size change stages).
        ``disabled_guards=("ManifestGate",)`` installs despite an incompatible manifest:
        the ``mismatch_installed`` bug, for demonstrations only."""
        geometry.check_pools(pools, "receiver pools")
        if geometry.cp != 1:
            raise ValueError(f"Receiver: cp={geometry.cp}; a receiver worker holds cp=1")
        if unknown := set(disabled_guards) - {"ManifestGate"}:
            raise ValueError(f"Receiver: unknown guards {sorted(unknown)}; known: ManifestGate")
        self.pools, self.geometry, self.transport, self.model = pools, geometry, transport, model
        self.stage, self.manifest_gate = stage, "ManifestGate" not in set(disabled_guards)
        self.local = geometry.to_local_config(model)
        self.pool_bytes = pools.alloc.capacity * pools.tp * pools.geometry.block_bytes
        self._expect: dict[str, _Expect] = {}
        self._att: dict[str, _Attempt] = {}
        self._errors: dict[str, OwnershipError] = {}  # refusals before any attempt began

    # ------------------------------------------------------------ queries
    def state(self, request_id: str) -> State:
        """WAITING (not final) before a manifest; REFUSED if refused before reserving."""
        a = self._att.get(request_id)
        if a is not None:
            return a.state
        return State.REFUSED if request_id in self._errors else State.WAITING

    def error(self, request_id: str) -> OwnershipError | None:
        a = self._att.get(request_id)
        return a.error if a is not None else self._errors.get(request_id)

    def result(self, request_id: str) -> Received:
        """The committed handoff; raises the refusal or failure otherwise."""
        a = self._att.get(request_id)
        if a is not None and a.state is State.DONE:
            return Received(request_id, tuple(a.target), a.m.num_tokens, a.m)
        err = self.error(request_id)
        if err is not None:
            raise err
        raise InUseError(f"{request_id!r}: handoff not finished (state {self.state(request_id)})")

    def checks(self, request_id: str) -> int:
        """Checksum comparisons that passed in the request's attempt."""
        a = self._att.get(request_id)
        return a.checks if a is not None else 0

    def held(self) -> dict[str, tuple[int, ...]]:
        """Blocks reserved by attempts that have not ended."""
        return {r: tuple(a.target) for r, a in self._att.items() if not a.state.final}

    # ------------------------------------------------------------ commands
    def expect(
        self,
        request_id: str,
        *,
        decode_room: int = 0,
        prefix: Sequence[int] = (),
        prefix_tokens: Sequence[int] | None = None,
    ) -> None:
        """Decode room to reserve, and the prefix blocks held here with the token ids whose
        KV they hold (whole blocks); a manifest whose first tokens differ is refused."""
        if type(decode_room) is not int or decode_room < 0:
            raise ValueError(f"decode_room={decode_room!r} must be an int >= 0")
        tokens = () if prefix_tokens is None else tuple(prefix_tokens)
        if len(tokens) != len(prefix) * self.geometry.block_size:  # which KV the prefix holds
            raise ValueError(
                f"{request_id!r}: prefix_tokens: {len(tokens)} token ids for {len(prefix)} "
                f"blocks of {self.geometry.block_size} held here"
            )
        self._expect[request_id] = _Expect(decode_room, tuple(prefix), tokens)

    def poll(self, request_id: str) -> int:
        """Handle every message that arrived; returns the number read."""
        msgs = self.transport.poll(channels(request_id).to_receiver)
        for header, payload in msgs:
            if not isinstance(header, dict):
                continue  # not a header: ignored
            kind = header.get("type")
            a = self._att.get(request_id)
            live = a is not None and not a.state.final
            if kind == MANIFEST and not live and _newer(header, a):
                self._on_manifest(request_id, header)
            elif a is None or a.state.final:
                continue  # nothing to do with it: before a manifest, or after the end
            elif kind == CHUNK:
                self._on_chunk(a, header, payload)
            elif kind == ABORT and wire.epoch_of(header) == a.m.epoch:
                reasons = wire.reasons_of(header)
                self._fail(a, CancelledError(f"sender aborted: {reasons}"), answer=False)
            else:
                a.stale += 1
        a = self._att.get(request_id)
        if a is not None and a.state is State.RECEIVING and self._complete(a):
            self._finish(a)
        return len(msgs)

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """End the attempt here (cancel, timeout, peer gone): give back every block."""
        a = self._att.get(request_id)
        if a is not None and not a.state.final:
            self._fail(a, CancelledError(f"{request_id!r} aborted by the receiver: {reason}"))

    def forget(self, request_id: str) -> None:
        """Drop the record of an ended attempt (so the request can be received again)."""
        a = self._att.get(request_id)
        if a is not None and not a.state.final:
            raise InUseError(f"{request_id!r} is still {a.state.value}; abort it first")
        self._att.pop(request_id, None)
        self._errors.pop(request_id, None)
        self._expect.pop(request_id, None)

    def crash(self) -> None:
        """Lose everything (a process crash): attempts forgotten, pools reset."""
        self._att.clear()
        self._errors.clear()
        self.pools.reset()

    # ------------------------------------------------------------ the manifest
    def _on_manifest(self, rid: str, header: Mapping[str, Any]) -> None:
        if not self.pools.alloc.blocks_of(rid):  # an ended attempt whose blocks are gone:
            self._att.pop(rid, None)  # this one replaces its record (else it is refused)
        try:
            a = self._accept(rid, header)
        except Exception as e:  # a peer's message: every failure is a nack, never raised
            if not isinstance(e, OwnershipError):
                e = CapacityError(f"{rid!r}: manifest not taken: {type(e).__name__}: {e}")
            self._errors[rid] = e
            reasons = e.reasons if isinstance(e, SpecManifestError) else [str(e)]
            mf = header.get("manifest")
            epoch = wire.epoch_of(mf) if isinstance(mf, dict) else None
            self._send(rid, {"type": NACK, "epoch": epoch, "reasons": reasons})
            return
        self._att[rid] = a
        self._errors.pop(rid, None)
        self._send(rid, {"type": READY, "epoch": a.m.epoch})

    def _accept(self, rid: str, header: Mapping[str, Any]) -> _Attempt:
        try:
            m = manifest_from_json(header.get("manifest"))
        except SpecManifestError as e:
            raise ManifestError.from_spec(e) from None
        verdict = check_compatible(m, self.local)
        reasons = list(verdict.reasons) if self.manifest_gate else []
        if m.request_id != rid:
            reasons.append(f"request_id: {m.request_id!r} on the channel of {rid!r}")
        if m.src_cp != 1:
            reasons.append(f"src_cp: {m.src_cp}; this receiver takes cp=1 senders only")
        ex = self._expect.get(rid, _Expect())
        g, alloc = self.geometry, self.pools.alloc
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
        stage = m.block_size != g.block_size or self.stage
        staged = len(m.sent_blocks) * src.rank_pool_geometry().block_bytes * src.tp
        alloc.incref(rid, ex.prefix)  # refuses a prefix block that is not valid here
        staging = None
        try:
            own = alloc.reserve(rid, max(0, need), epoch=m.epoch)
            if stage and staged > self.pool_bytes:  # checked before anything is allocated
                raise CapacityError(f"staging {staged} bytes > the pool's {self.pool_bytes}")
            if stage:  # checked and reserved: only now allocated
                staging = src.make_pools(max(1, len(m.sent_blocks)))
                staging.alloc.reserve(rid, len(m.sent_blocks), epoch=m.epoch)
        except Exception:  # give back the prefix references and the reservation just taken
            alloc.quarantine(rid)  # nothing was written: free at once
            alloc.unquarantine_and_free(rid, m.epoch)
            raise
        plan = sm.tp_reshard_plan(m.kv_heads, m.src_tp, g.tp)
        ranks = [r for r in range(m.src_tp) if sm.tp_is_primary(m.kv_heads, m.src_tp, r)]
        pieces = {r: [p for p in plan if p.src_rank == r] for r in ranks}
        return _Attempt(m, [*ex.prefix, *own], len(ex.prefix), src, ranks, pieces, staging)

    # ------------------------------------------------------------ chunks
    def _on_chunk(self, a: _Attempt, header: Mapping[str, Any], payload: Payload) -> None:
        m = a.m
        if header.get("request_id") != m.request_id or wire.epoch_of(header) != m.epoch:
            a.stale += 1  # another attempt's chunk: fenced, changes nothing
            return
        rank, idx = header.get("rank"), header.get("block_index")
        try:
            if type(rank) is not int or rank not in a.ranks:
                raise ChunkError(f"chunk of rank {rank!r}; senders {a.ranks}", prop="RankAgreement")
            if type(idx) is not int or idx not in m.sent_blocks:
                raise ChunkError(f"block_index {idx!r} not in sent blocks {m.sent_blocks}")
            if (rank, idx) in a.landed:
                a.duplicates += 1
                return
            want = a.src.rank_pool_geometry().block_bytes
            if len(payload) != want:
                raise ChunkError(f"block {idx} rank {rank}: {len(payload)} bytes, expected {want}")
            actual = bytes_checksum(payload)
            if actual != header.get("checksum"):
                raise ChecksumError(
                    f"block {idx} (rank {rank}): bytes do not hash to the header's checksum "
                    f"({actual} != {header.get('checksum')!r})"
                )
            canonical = m.src_tp == 1 and m.layout == sm.LAYOUTS[0]
            expected = m.block_checksums[idx - m.prefix_blocks]
            if canonical and actual != expected:
                raise ChecksumError(
                    f"block {idx}: bytes hash to {actual}, not the manifest's checksum {expected}"
                )
            self._install(a, rank, idx, payload)
        except OwnershipError as e:
            self._fail(a, e)
            return
        a.landed.add((rank, idx))  # counted only once the install returned
        a.checks += 1
        if canonical and a.staging is None and len(a.pieces[rank]) == 1:
            a.verified.add(idx)  # verified bytes, copied whole: no need to hash again

    def _install(self, a: _Attempt, rank: int, idx: int, payload: Payload) -> None:
        j = idx - a.m.prefix_blocks  # index among the sent blocks
        rid = a.m.request_id
        if a.staging is not None:
            a.staging.pools[rank].write_block_bytes(rid, a.staging.alloc.blocks_of(rid)[j], payload)
            return
        b = a.target[a.prefix + j]
        self.pools.alloc.check_write(rid, [b])
        land_shard(self.pools, a.pieces[rank], a.src.rank_pool_geometry(), payload, b)

    def _complete(self, a: _Attempt) -> bool:
        return len(a.landed) == len(a.ranks) * len(a.m.sent_blocks)

    # ------------------------------------------------------------ the end
    def _finish(self, a: _Attempt) -> None:
        m, rid, alloc = a.m, a.m.request_id, self.pools.alloc
        try:
            todo = [i for i in m.sent_blocks if i not in a.verified]
            if a.staging is not None:
                ids = a.staging.alloc.blocks_of(rid)
                full = a.staging.gather([ids[i - m.prefix_blocks] for i in todo])
            else:
                full = self.pools.gather([a.target[a.prefix + i - m.prefix_blocks] for i in todo])
            for i, blk in zip(todo, full, strict=True):
                got, want = block_checksum(blk), m.block_checksums[i - m.prefix_blocks]
                if got != want:
                    raise ChecksumError(
                        f"block {i}: bytes hash to {got}, not the manifest's checksum {want}"
                    )
                a.checks += 1
            if a.staging is not None and m.sent_blocks:
                self._reshard(a)
            alloc.commit(rid, m.epoch)
        except OwnershipError as e:
            self._fail(a, e)
            return
        a.state, a.staging = State.DONE, None
        self._send(rid, {"type": ACK, "epoch": m.epoch})

    def _reshard(self, a: _Attempt) -> None:
        m, rid = a.m, a.m.request_id
        assert a.staging is not None
        ids = list(a.staging.alloc.blocks_of(rid))
        src = ShardedKV(
            a.src.kv_layout(),
            [[p.kv] for p in a.staging.pools],
            [ids[:1] * m.prefix_blocks + ids],  # the prefix entries are never read
            m.num_tokens,
        )
        self.pools.alloc.check_write(rid, a.target[a.prefix :])
        dst = ShardedKV(self.geometry.kv_layout(), [[p.kv] for p in self.pools.pools], [a.target])
        reshard(src, dst, start=m.prefix_blocks * m.block_size)

    def _fail(self, a: _Attempt, err: OwnershipError, *, answer: bool = True) -> None:
        """Give back every block of the attempt, drop what is in flight, tell the sender."""
        rid, alloc = a.m.request_id, self.pools.alloc
        alloc.quarantine(rid)  # reserved blocks: no reader, no reuse yet
        alloc.unquarantine_and_free(rid, a.m.epoch)  # installs are synchronous: all done
        a.state, a.error, a.staging = State.ABORTED, err, None
        self.transport.abort(channels(rid).to_receiver)
        if answer:
            self._send(rid, {"type": NACK, "epoch": a.m.epoch, "reasons": [str(err)]})

    def _send(self, rid: str, header: dict[str, Any]) -> None:
        self.transport.send(channels(rid).to_sender, header)


def _newer(header: Mapping[str, Any], a: _Attempt | None) -> bool:
    """A manifest starts an attempt unless one of this or a later epoch already ran."""
    mf = header.get("manifest")
    epoch = wire.epoch_of(mf) if isinstance(mf, dict) else None
    return a is None or (epoch is not None and epoch > a.m.epoch)
