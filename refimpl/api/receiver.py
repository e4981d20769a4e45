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
A streamed offer (``layers=L``): a chunk per layer, a seal per rank (``refimpl.api.layers``).

At the end: every canonical block (all heads, heads_major) hashes to the manifest's
checksum (else ``ChecksumError``), then commit (RESERVED -> OWNED) and ``ack``. Any
failure after the reservation aborts: the reserved blocks go back to the pool (quarantine,
then free: installs are synchronous), chunks in flight are dropped, and the sender gets a
``nack`` naming the error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from refimpl.api import wire
from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.intake import Attempt, Expect, accept, newer, reply_channels
from refimpl.api.layers import SEAL, land_layer, write_bytes
from refimpl.api.wire import ABORT, ACK, CHUNK, MANIFEST, NACK, READY, State, channels
from refimpl.checksum import block_checksum, bytes_checksum
from refimpl.engine.data import RankPools, land_shard
from refimpl.errors import (
    CancelledError,
    CapacityError,
    ChecksumError,
    ChunkError,
    InUseError,
    OwnershipError,
)
from refimpl.reshard import ShardedKV, reshard
from refimpl.transport import Payload, Transport
from spec import shardmap as sm
from spec.manifest import Manifest
from spec.manifest import ManifestError as SpecManifestError


@dataclass(frozen=True, slots=True)
class Received:
    """A committed handoff: the request now owns ``blocks`` here (logical order)."""

    request_id: str
    blocks: tuple[int, ...]  # prefix blocks, then the received ones, then decode room
    num_tokens: int
    manifest: Manifest


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
        self._expect: dict[str, Expect] = {}
        self._att: dict[str, Attempt] = {}
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

    def layer_ready(self, request_id: str, layer: int) -> bool:
        """Every sent block of a streamed attempt has ``layer`` installed (landed, not
        owned: the blocks are the request's only at commit; see ``refimpl.api.layers``).
        True for every layer once committed; False before a manifest or after a failure.
        With a block-size change (or ``stage=True``) a ready layer is in staging; it
        reaches the target blocks at commit."""
        a = self._att.get(request_id)
        if a is None or a.state in (State.ABORTED, State.REFUSED):
            return False
        if a.state is State.DONE or a.stream is None:
            return a.state is State.DONE
        return a.stream.layer_ready(layer)

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
        self._expect[request_id] = Expect(decode_room, tuple(prefix), tokens)

    def poll(self, request_id: str) -> int:
        """Handle every message that arrived; returns the number read."""
        msgs = self.transport.poll(channels(request_id).to_receiver)
        for header, payload in msgs:
            if not isinstance(header, dict):
                continue  # not a header: ignored
            kind = header.get("type")
            a = self._att.get(request_id)
            live = a is not None and not a.state.final
            if kind == MANIFEST and not live and newer(header, a):
                self._on_manifest(request_id, header)
            elif a is None or a.state.final:
                continue  # nothing to do with it: before a manifest, or after the end
            elif kind == CHUNK:
                self._on_chunk(a, header, payload)
            elif kind == SEAL and a.stream is not None and self._ours(a, header):
                try:
                    a.stream.seal(header.get("rank"), header.get("digests"))
                except OwnershipError as e:
                    self._fail(a, e)
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
            a = accept(self, rid, header, self._expect.get(rid, Expect()))
        except Exception as e:  # a peer's message: every failure is a nack, never raised
            if not isinstance(e, OwnershipError):
                e = CapacityError(f"{rid!r}: manifest not taken: {type(e).__name__}: {e}")
            self._errors[rid] = e
            reasons = e.reasons if isinstance(e, SpecManifestError) else [str(e)]
            mf = header.get("manifest")
            epoch = wire.epoch_of(mf) if isinstance(mf, dict) else None
            for to in reply_channels(rid, header):
                self.transport.send(to, {"type": NACK, "epoch": epoch, "reasons": reasons})
            return
        self._att[rid] = a
        self._errors.pop(rid, None)
        self._send(rid, {"type": READY, "epoch": a.m.epoch})

    # ------------------------------------------------------------ chunks
    def _on_chunk(self, a: Attempt, header: Mapping[str, Any], payload: Payload) -> None:
        m = a.m
        if not self._ours(a, header):
            return
        if a.stream is not None:
            self._on_layer(a, header, payload)
            return
        try:
            rank, idx = _where(a, header)
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

    def _install(self, a: Attempt, rank: int, idx: int, payload: Payload) -> None:
        j = idx - a.m.prefix_blocks  # index among the sent blocks
        rid = a.m.request_id
        if a.staging is not None:
            a.staging.pools[rank].write_block_bytes(rid, a.staging.alloc.blocks_of(rid)[j], payload)
            return
        b = a.target[a.prefix + j]
        self.pools.alloc.check_write(rid, [b])
        land_shard(self.pools, a.pieces[rank], a.src.rank_pool_geometry(), payload, b)

    def _ours(self, a: Attempt, header: Mapping[str, Any]) -> bool:
        """This attempt's message, else counted as stale (fenced, changes nothing)."""
        if header.get("request_id") == a.m.request_id and wire.epoch_of(header) == a.m.epoch:
            return True
        a.stale += 1
        return False

    def _on_layer(self, a: Attempt, header: Mapping[str, Any], payload: Payload) -> None:
        """One (rank, block, layer) of a streamed offer: checked, installed, then counted."""
        m, s = a.m, a.stream
        assert s is not None
        try:
            rank, idx = _where(a, header)
            j, layer = idx - m.prefix_blocks, s.check_layer(header.get("layer"))
            if (rank, j, layer) in s.landed:
                a.duplicates += 1
                return
            want = a.src.rank_pool_geometry().block_bytes // m.num_layers
            if len(payload) != want:
                raise ChunkError(
                    f"block {idx} rank {rank} layer {layer}: {len(payload)} bytes, expected {want}"
                )
            actual = bytes_checksum(payload)
            if actual != header.get("checksum"):
                raise ChecksumError(
                    f"block {idx} (rank {rank}, layer {layer}): bytes do not hash to the "
                    f"header's checksum ({actual} != {header.get('checksum')!r})"
                )
            rid = m.request_id
            if a.staging is not None:
                blk = a.staging.alloc.blocks_of(rid)[j]
                a.staging.alloc.check_write(rid, [blk])
                write_bytes(a.staging.pools[rank].kv[blk][layer], payload)
            else:
                b = a.target[a.prefix + j]
                self.pools.alloc.check_write(rid, [b])
                src_g = a.src.rank_pool_geometry()
                land_layer(self.pools, a.pieces[rank], src_g, payload, b, layer)
        except OwnershipError as e:
            self._fail(a, e)
            return
        s.landed_one(rank, j, layer, payload)  # counted (and hashed) once installed
        a.checks += 1

    def _complete(self, a: Attempt) -> bool:
        if a.stream is not None:
            return a.stream.complete()
        return len(a.landed) == len(a.ranks) * len(a.m.sent_blocks)

    # ------------------------------------------------------------ the end
    def _finish(self, a: Attempt) -> None:
        m, rid, alloc = a.m, a.m.request_id, self.pools.alloc
        try:
            if a.stream is not None:  # every block's layers against its rank's seal
                a.checks += a.stream.verify(m.prefix_blocks)
                a.verified.update(m.sent_blocks)
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

    def _reshard(self, a: Attempt) -> None:
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

    def _fail(self, a: Attempt, err: OwnershipError, *, answer: bool = True) -> None:
        """Give back every block of the attempt, drop what is in flight, tell the sender."""
        rid, alloc = a.m.request_id, self.pools.alloc
        alloc.quarantine(rid)  # reserved blocks: no reader, no reuse yet
        alloc.unquarantine_and_free(rid, a.m.epoch)  # installs are synchronous: all done
        a.state, a.error, a.staging = State.ABORTED, err, None
        self.transport.abort(channels(rid).to_receiver)
        if answer:
            self._send(rid, {"type": NACK, "epoch": a.m.epoch, "reasons": [str(err)]})

    def _send(self, rid: str, header: dict[str, Any]) -> None:
        a = self._att.get(rid)
        tos = [channels(rid).to_sender]
        if a is not None and a.ranked and a.m.epoch == header.get("epoch"):
            tos = [channels(rid).to_rank(r) for r in range(a.m.src_tp)]  # every rank's Sender
        for to in tos:
            self.transport.send(to, header)


def _where(a: Attempt, header: Mapping[str, Any]) -> tuple[int, int]:
    """A chunk's (source rank, block index), or ChunkError naming what is wrong."""
    rank, idx = header.get("rank"), header.get("block_index")
    if type(rank) is not int or rank not in a.ranks:
        raise ChunkError(f"chunk of rank {rank!r}; senders {a.ranks}", prop="RankAgreement")
    if type(idx) is not int or idx not in a.m.sent_blocks:
        raise ChunkError(f"block_index {idx!r} not in sent blocks {a.m.sent_blocks}")
    return rank, idx
