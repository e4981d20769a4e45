"""``Receiver``: the destination end of a handoff; it cannot commit what it did not install.

    rx = Receiver(pools, geometry, transport, model)     # geometry checked against pools
    rx.expect("req-1", decode_room=64)                   # optional: room, prefix held here
    while not rx.state("req-1").final: rx.poll("req-1")  # WAITING until the manifest
    got = rx.result("req-1")                             # Received, or raises why not

On the manifest: parse (hostile input), ``check_compatible`` against this side's
``LocalConfig``, the prefix held here against the manifest's first token ids, reserve
the target blocks, the staging copy (another block size) no larger than this side's
pool (``CapacityError``; in total over every live attempt's staging, not per attempt),
and only then allocate it. Any refusal or failure answers ``nack`` with the reasons and
keeps nothing; ``poll`` and ``abort`` never raise on a peer's message (a reply the
transport cannot route ends the attempt by name, ``RankAgreement``).

Per chunk: request + epoch (an int, else fenced and counted), then ``refimpl.api.install``
(checked, installed, only then counted): straight into its target block with the same
block size, else into a staging copy of the sender's geometry that goes into the targets
layer by layer (streamed: as each layer completes) or at the end. A sender's process that
the transport reports gone (``DistTransport.failed``) ends the attempt with its reason.
At the end: every canonical block (all heads, heads_major) hashes to the manifest's
checksum (else ``ChecksumError``), then commit (RESERVED -> OWNED) and ``ack``. Any
failure after the reservation aborts: the reserved blocks go back to the pool (or stay
quarantined: ``quarantine.give_back``), chunks in flight are dropped, the sender is nacked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass
from typing import Any

from refimpl.api import wire
from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.install import ChunkIntake
from refimpl.api.intake import (
    Attempt,
    Expect,
    aborting_ranks,
    early_abort,
    on_manifest,
    send_quietly,
    tos,
)
from refimpl.api.layers import SEAL
from refimpl.api.switches import (
    LAYER_READY_ON_STAGING,
    RECEIVER_SWITCHES,
    STALE_INCARNATION_ACCEPTED,
    check_switches,
)
from refimpl.api.tokens import read_kv, write_kv_layer
from refimpl.api.unrevocable import quarantine as qr
from refimpl.api.wire import ABORT, ACK, CHUNK, MANIFEST, NACK, Incarnated, State, channels
from refimpl.engine.data import RankPools
from refimpl.errors import (
    CancelledError,
    ChecksumError,
    DecodeFailedError,
    InUseError,
    OwnershipError,
    StaleError,
)
from refimpl.transport import Transport
from spec.manifest import Manifest


@dataclass(frozen=True, slots=True)
class Received:
    """A committed handoff: the request now owns ``blocks`` here (logical order)."""

    request_id: str
    blocks: tuple[int, ...]  # prefix blocks, then the received ones, then decode room
    num_tokens: int
    manifest: Manifest


class Receiver(ChunkIntake, Incarnated):
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
        mutants: Iterable[str] = (),
        max_records: int = 4096,
        incarnation: int = 0,
    ) -> None:
        """``stage``: land every chunk in staging, so that the target blocks are written
        only after every block verified (else only a block-size change stages).
        ``disabled_guards=("ManifestGate",)`` installs despite an incompatible manifest:
        the ``mismatch_installed`` bug, for demonstrations only; ``mutants``: bug
        switches (``refimpl.api.switches``), for demonstrations only. ``max_records``:
        ended attempts and refusals kept for ``state``/``result`` until ``forget`` (past
        it the oldest ended ones are forgotten: a peer cannot fill memory with them).
        ``incarnation``: this process's restarts so far (a restarted decode builds a new
        Receiver, with the next one, over its new pools): its replies carry it, and a
        write addressed to another incarnation's registration is refused by name."""
        self.mutants = check_switches(mutants, RECEIVER_SWITCHES, "Receiver")
        stale_ok = STALE_INCARNATION_ACCEPTED in self.mutants
        self.inc = wire.Incarnations(incarnation, "Receiver", stale_ok)
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
        self._ended: dict[str, None] = {}  # rids with an ended record, oldest first
        self._aborted: dict[str, tuple[int, list[str]]] = {}  # aborts before the manifest
        self._fenced: dict[str, int] = {}  # the newest epoch refused at intake
        self._ends: dict[str, str] = {}  # requests the scheduler ended (``end``), why
        self._late: dict[str, qr.Late] = {}  # quarantined attempts (``quarantine``)
        self.max_records = max_records

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
            if not set(a.target) <= set(self.pools.alloc.blocks_of(request_id)):
                raise StaleError(
                    f"{request_id!r}: attempt {a.m.epoch} committed, but its blocks were "
                    "freed here since; no block ids to answer (forget it, or receive it again)"
                )
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
        """Every sent block of a streamed attempt has ``layer`` in the blocks ``held()``
        names (landed, not owned: the blocks are the request's only at commit; see
        ``refimpl.api.layers``). True for every layer once committed; False before a
        manifest or after a failure. With a block-size change a layer goes from staging
        into the target blocks once every block of it landed; with ``stage=True`` the
        targets are written only at the commit, so no layer is ready before it."""
        a = self._att.get(request_id)
        if a is None or a.state in (State.ABORTED, State.REFUSED):
            return False
        if a.state is State.DONE or a.stream is None:
            return a.state is State.DONE
        if a.staging is not None and LAYER_READY_ON_STAGING not in self.mutants:
            return layer in a.unstaged  # in the targets, not only in staging
        return a.stream.layer_ready(layer)

    def held(self) -> dict[str, tuple[int, ...]]:
        """Blocks reserved by attempts that have not ended, and those quarantined."""
        out = {r: tuple(a.target) for r, a in self._att.items() if not a.state.final}
        return {**out, **self.quarantined()}

    def quarantined(self) -> dict[str, tuple[int, ...]]:
        """Blocks of ended attempts a write may still land in (``quarantine``)."""
        return {r: self.pools.alloc.quarantined(r) for r, q in self._late.items() if q.held}

    def records(self) -> dict[str, int]:
        """Per-request entries kept (a memory test reads these; ``forget`` empties them)."""
        kept: dict[str, Sized] = {"attempts": self._att, "refusals": self._errors}
        kept.update(expected=self._expect, early_aborts=self._aborted, ends=self._ends)
        return {**{k: len(v) for k, v in kept.items()}, "staged_bytes": self.staged_bytes()}

    def staged_bytes(self) -> int:
        """Staging copies held by live attempts (bounded in total by the pool's bytes)."""
        return sum(a.staged for a in self._att.values() if a.staging is not None)

    # ------------------------------------------------------------ commands
    def peer_restarted(self, incarnation: int) -> None:
        """The sender's process came back as ``incarnation`` (the engine's membership
        says so): from now on an older one's manifest, seal or abort is refused by name
        and changes nothing. An attempt it opened here still ends by its timeout
        (``abort``), as the spec's ``DecodeTimeout``."""
        self.inc.restarted(incarnation)

    def expect(
        self,
        request_id: str,
        *,
        decode_room: int = 0,
        prefix: Sequence[int] = (),
        prefix_tokens: Sequence[int] | None = None,
        blocks: Sequence[int] | None = None,
    ) -> None:
        """Decode room to reserve, and the prefix blocks held here with the token ids whose
        KV they hold (whole blocks); a manifest whose first tokens differ is refused.
        ``blocks``: the destination blocks the engine's scheduler allocated (registered
        memory, ``refimpl.memory``), reserved at the manifest in place of ``decode_room``:
        enough for the tokens after the prefix, else the manifest is refused."""
        if type(decode_room) is not int or decode_room < 0:
            raise ValueError(f"decode_room={decode_room!r} must be an int >= 0")
        if blocks is not None:  # checked now: the manifest's answer must not be a surprise
            blocks = self.pools.alloc.check_ids(blocks, f"{request_id!r}: blocks")
            if both := sorted(set(blocks) & set(prefix)):
                raise ValueError(f"{request_id!r}: blocks {both} are prefix blocks too")
        tokens = () if prefix_tokens is None else tuple(prefix_tokens)
        if len(tokens) != len(prefix) * self.geometry.block_size:  # which KV the prefix holds
            raise ValueError(
                f"{request_id!r}: prefix_tokens: {len(tokens)} token ids for {len(prefix)} "
                f"blocks of {self.geometry.block_size} held here"
            )
        given = None if blocks is None else tuple(blocks)
        self._expect[request_id] = Expect(decode_room, tuple(prefix), tokens, given)

    def poll(self, request_id: str) -> int:
        """Handle every message that arrived; returns the number read."""
        msgs = self.transport.poll(channels(request_id).to_receiver)
        for header, payload in msgs:
            if not isinstance(header, dict) or self.inc.stale(request_id, header):
                continue  # not a header, or a dead incarnation's (named): ignored
            kind = header.get("type")
            a = self._att.get(request_id)
            live = a is not None and not a.state.final
            if qr.on_quarantined(self, request_id, header, payload):
                continue  # a quarantined attempt's late write, or its writer's Quiesced
            if kind == MANIFEST and not live:
                on_manifest(self, request_id, header, a)
            elif kind == ABORT and not live:
                early_abort(self, request_id, header, a)
            elif a is None or a.state.final:
                continue  # nothing to do with it: before a manifest, or after the end
            elif kind == CHUNK:
                self._on_chunk(a, header, payload)
                if a.state.final:  # the chunk ended it (a bad checksum): it has landed
                    qr.on_quarantined(self, request_id, header, payload)
            elif kind == SEAL and a.stream is not None and self._ours(a, header):
                try:
                    a.stream.seal(header)
                except OwnershipError as e:
                    self._fail(a, e)
            elif kind == ABORT and wire.epoch_of(header) == a.m.epoch:
                reasons = wire.reasons_of(header)  # every other rank hears it, with why
                told = aborting_ranks(msgs, a) if a.ranked else None  # not those that said it
                self._fail(a, CancelledError(f"sender aborted: {reasons}"), skip=told)
                qr.quiesce(self, request_id, header)  # its writes are over (the spec's Quiesced)
            elif kind == ABORT:
                self._ours(a, header)  # another attempt's: fenced (or the ranks disagree)
            else:
                a.stale += 1
        qr.deferred(self, request_id)  # a manifest that waited on a quarantine now over
        a, ended = self._att.get(request_id), request_id in self._ends  # StickyEnd
        if a is not None and a.state is State.RECEIVING and not ended and self._complete(a):
            self._finish(a)
        elif (
            a is not None
            and not a.state.final
            and (why := wire.peer_failed(self.transport, tos(a)))
        ):
            self._fail(a, CancelledError(f"a sender's process is gone: {why}"))
        return len(msgs)

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """End the attempt here (cancel, timeout, peer gone): give back every block."""
        qr.release(self, request_id)
        a = self._att.get(request_id)
        if a is not None and not a.state.final:
            self._fail(a, CancelledError(f"{request_id!r} aborted by the receiver: {reason}"))

    def fail(self, request_id: str, reason: str) -> None:
        """The engine's own failure of the attempt being received (a load error, its step
        failed): never verified or committed, every block given back, the sender nacked
        with the reason (it may retry); nothing if the attempt is final (see README)."""
        if (a := self._att.get(request_id)) is not None and not a.state.final:
            self._fail(a, DecodeFailedError(f"{request_id!r} failed on decode: {reason}"))

    def end(self, request_id: str, reason: str = "cancelled") -> None:
        """The scheduler has ended the request (cancelled, failed, finished): from now on
        its manifest is refused at intake with a nack alone (its epoch fenced), and an
        attempt in progress is never verified or committed (``abort`` gives it up)."""
        if request_id not in self._ends:
            self._ends[request_id] = reason
            self._ended_now(request_id)

    def forget(self, request_id: str) -> None:
        """Drop the record of an ended attempt (so the request can be received again)."""
        a = self._att.get(request_id)
        if a is not None and not a.state.final:
            raise InUseError(f"{request_id!r} is still {a.state.value}; abort it first")
        qr.drop_late(self, request_id)  # (a quarantine stays until its Quiesced or abort)
        for d in (self._att, self._errors, self._expect, self._ended, self._aborted):
            d.pop(request_id, None)
        self._fenced.pop(request_id, None)
        self._ends.pop(request_id, None)

    def crash(self) -> None:
        """Lose everything (a process crash): attempts forgotten, pools reset."""
        for d in (self._att, self._errors, self._ended, self._aborted, self._fenced, self._ends):
            d.clear()
        self._late.clear()
        self.pools.reset()

    # ------------------------------------------------------------ records
    def _ended_now(self, rid: str) -> None:
        """``rid``'s record ended: the oldest ended ones past ``max_records`` are dropped."""
        self._ended.pop(rid, None)
        self._ended[rid] = None
        while len(self._ended) > self.max_records:
            old = next(iter(self._ended))
            del self._ended[old]
            if (a := self._att.get(old)) is None or a.state.final:
                for d in (self._att, self._errors, self._aborted, self._fenced, self._ends):
                    d.pop(old, None)
                qr.drop_late(self, old)

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
                sums = a.staging.checksums([ids[i - m.prefix_blocks] for i in todo])
            else:
                sums = self.pools.checksums(
                    [a.target[a.prefix + i - m.prefix_blocks] for i in todo]
                )
            for i, got in zip(todo, sums, strict=True):
                want = m.block_checksums[i - m.prefix_blocks]
                if got != want:
                    raise ChecksumError(
                        f"block {i}: bytes hash to {got}, not the manifest's checksum {want}"
                    )
                a.checks += 1
            if a.staging is not None and m.sent_blocks:
                self._unstage(a, [x for x in range(m.num_layers) if x not in a.unstaged])
            alloc.commit(rid, m.epoch)
        except OwnershipError as e:
            self._fail(a, e)
            return
        a.state, a.staging = State.DONE, None
        self._ended_now(rid)
        wire.fence(self.transport, channels(rid).to_receiver, m.epoch)  # late duplicates
        self._send(rid, {"type": ACK, "epoch": m.epoch})

    def _unstage(self, a: Attempt, layers: Sequence[int]) -> None:
        """Layers of the staging copy into the target blocks (resharded: this side's
        block size, TP ranks and layout), the prefix blocks untouched."""
        assert a.staging is not None
        m, rid = a.m, a.m.request_id
        ids = a.staging.alloc.blocks_of(rid)
        sent_tokens = m.num_tokens - m.prefix_blocks * m.block_size
        for layer in layers:
            fields = read_kv(a.staging, ids, sent_tokens, layer=layer)
            write_kv_layer(self.pools, rid, a.target[a.prefix :], layer, list(fields))
            a.unstaged.add(layer)

    def _fail(
        self, a: Attempt, err: OwnershipError, *, skip: frozenset[int] | None = frozenset()
    ) -> None:
        """Give back every block of the attempt, drop what is in flight, tell the sender
        (every rank but those in ``skip``; ``None``: nobody)."""
        rid = a.m.request_id
        qr.give_back(self, a, err)  # or, unrevocable, quarantined till the writer's Quiesced
        a.state, a.error, a.staging = State.ABORTED, err, None
        self._ended_now(rid)
        if skip is not None:
            nack = {"type": NACK, "epoch": a.m.epoch, "reasons": [str(err)]}
            self._send(rid, nack, skip)

    def _send(self, rid: str, header: dict[str, Any], skip: frozenset[int] = frozenset()) -> str:
        """Send to the request's sender (every rank's, when ranked, but those in
        ``skip``); returns why a send failed ("" if none did): a route the transport
        cannot reach is the peer's fault, never raised here."""
        wire.stamp(header, self.inc.own)
        a = self._att.get(rid)
        to = tos(a, skip) if a is not None and a.m.epoch == header.get("epoch") else None
        to = to if to is not None else [channels(rid).to_sender]
        return "; ".join(filter(None, (send_quietly(self.transport, x, header) for x in to)))
