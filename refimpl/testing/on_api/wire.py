"""A transport the spec schedules: the API's messages in flight, delivered one at a time.

``SpecTransport`` implements ``refimpl.transport.Transport`` (``send``/``poll``/``abort``)
for the API adapter (``api_adapter``). Nothing a side sends is delivered until the
environment says so: the spec's network is a multiset and delivery order is free, so a
spec action that consumes a message (``DecodeReceiveChunk``, ``PrefillRecvReady``, ...)
``deliver``s exactly that message, and the side's next ``poll`` sees it alone.

One *logical* message is what the spec calls one message, named with the incarnation
its header carries (``inc``: the sender's, a chunk its target's; spec ``msg_inc``):

    manifest                    Handoff (HandoffBadManifest once ``mismatch`` rewrote it)
    chunk (rank, block, layer)  the L layer chunks of one (rank, block) are one Chunk
                                (idx = rank * (m - hit) + block - hit, hit the attempt's
                                prefix blocks, not sent: ``hit_of``), ChunkCorrupt once
                                a byte flipped
    seal (rank)                 RankDone (idx = rank)
    ready / ack / nack          Ready (idx = hit) / Ack / Nack, one message although the
                                receiver sends a copy to every source rank's channel
                                (``to_rank``)
    abort (sender -> receiver)  Quiesced: the sender's writes of the attempt are over (one
                                for the aborts of every rank in one step)
    abort (rank -> rank)        none: a ranked Sender tells its siblings (issue #30 bug 3);
                                the spec's prefill is one worker, so it is there at once

With decode ranks (``group_of``: ``refimpl.api.ranks``' group channels, one sub-handoff
per decode rank, ``on_api/worlds/ranks.py``) one logical message is every sub-handoff's
copy of it sent in one step (the spec's decode is one worker of ``dst_tp`` ranks); a
group message between ranks of one side is there at once (inside one spec worker), and
one across the sides travels with the spec message its sender sent in the same step
(an offer with the manifests, an abort with the sender's aborts or the nacks, an
"installed" with the acks; sent before it in the step, it waits for it: ``crossing``),
else it is there at the step's end (``flush``: it has no spec message). The
ranks' replies to prefill are the decode worker's one verdict: a Nack if any rank
nacked (a rank that committed before it heard a sibling's abort acks its part, then
gives its blocks back: no spec Ack), else the Ack once every decode rank acked (with
prefill TP > 1 a rank may commit its part before another's chunks landed: its ack is
``held`` till then, as the spec's decode acks only at the commit). A sub-handoff's
chunk or seal names its piece's index as its rank: ``rank_of`` names the prefill rank.

``abort(channel)`` revokes the *writes* (chunks) in flight on the channel, as the spec's
fence and flush do (``drop_chunks``); a control message once posted is not recalled.
Each message is named from its bytes (``kind``): a chunk whose payload no longer hashes
to its header's checksum is a ChunkCorrupt, a manifest the receiver's local config
refuses a HandoffBadManifest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from refimpl.api.wire import ABORT, ACK, CHUNK, MANIFEST, NACK, READY, SEAL
from refimpl.checksum import bytes_checksum
from refimpl.transport import Message, Payload
from spec.state import (
    M_ACK,
    M_CHUNK,
    M_CHUNK_BAD,
    M_DONE,
    M_HANDOFF,
    M_HANDOFF_BAD,
    M_NACK,
    M_QUIESCED,
    M_READY,
    msg,
)

CONTROL_KINDS = {MANIFEST: M_HANDOFF, READY: M_READY, SEAL: M_DONE, ACK: M_ACK, NACK: M_NACK}


@dataclass
class Logical:
    """One spec message: the request, its direction, and its copies on the channels."""

    rid: str
    to_d: bool
    group: tuple[Any, ...]  # what makes copies one message (a chunk's (epoch, rank, block))
    copies: list[tuple[str, str, Payload]] = field(default_factory=list)  # (channel, text, data)
    tick: int = -1  # the step that sent it

    @property
    def header(self) -> dict[str, Any]:
        return dict(json.loads(self.copies[0][1]))


class SpecTransport:
    """Messages in flight as logical messages; delivery, loss, duplication, corruption and
    a manifest mismatch are the environment's (the spec's) steps."""

    def __init__(
        self,
        rid_of: Callable[[str], tuple[str, bool]],
        group_of: Callable[[str], str | None] | None = None,
        *,
        revocable: bool = True,
        rank_of: Callable[[str, int], int] | None = None,
        dst_ranks: int = 1,
    ) -> None:
        self.rid_of = rid_of  # channel -> (request id, to decode?)
        # (channel, a chunk's or seal's header rank) -> the spec's prefill rank (decode
        # ranks: a sub-handoff's rank is its piece's index, ``on_api/worlds/ranks.py``)
        self.rank_of = rank_of or (lambda channel, rank: rank)
        self.dst_ranks = dst_ranks  # decode ranks: each sub-handoff's reply is one rank's
        self.held: dict[tuple[str, Any], Logical] = {}  # the ranks' acks so far, per attempt
        self.crossing: list[tuple[str, bool, str, str]] = []  # (rid, to_d, channel, text)
        self.revocable = revocable  # False: a write in flight cannot be taken back
        self.group_of = group_of  # a rank group's channel -> its side ("p"/"d"), else None
        self.flight: list[Logical] = []
        self._delivered: dict[str, list[tuple[str, Payload]]] = {}
        self.tick = 0  # the environment's step (the adapter's): what one step sends
        self.alive: Callable[[bool], bool] = lambda to_d: True  # is that side's worker up?
        # the prefix blocks an attempt (request id, epoch) does not send: its manifest's
        self.hit_of: Callable[[str, int], int] = lambda rid, epoch: 0

    # ------------------------------------------------------------ Transport
    def send(self, channel: str, header: Mapping[str, Any], payload: Payload = b"") -> None:
        text = json.dumps(header, allow_nan=False, separators=(",", ":"))
        rid, to_d = self.rid_of(channel)
        if not self.alive(to_d):
            return  # a message to a dead worker vanishes (its connection is gone)
        kind = header.get("type")
        if self.group_of is not None and self._group_message(channel, header, text, rid, to_d):
            return
        if kind == ABORT and not to_d:  # a prefill rank's abort told to its siblings
            self._delivered.setdefault(channel, []).append((text, bytes(payload)))
            return  # inside the spec's one prefill worker: no spec message, no delay
        if kind == CHUNK:
            group: tuple[Any, ...] = (
                CHUNK,
                header.get("epoch"),
                self.rank_of(channel, int(header.get("rank", 0))),
                header.get("block_index"),
            )
        elif kind == ABORT:
            group = (ABORT, header.get("epoch"), self.tick)  # every rank's, one step: one
        elif self.group_of is not None:  # every sub-handoff's copy of one step: one
            verdict = "verdict" if kind in (ACK, NACK) else kind  # the ranks' acks and nacks
            rank = header.get("rank")
            if kind == SEAL:
                rank = self.rank_of(channel, int(rank or 0))
            group = (verdict, header.get("epoch"), rank, self.tick)
        elif to_d:
            group = (text, len(self.flight))  # one message per send
        else:
            group = (text,)  # the copies of one reply to every source rank
        for lm in reversed(self.flight):
            if lm.rid == rid and lm.to_d == to_d and lm.group == group:
                if all(ch != channel for ch, _, _ in lm.copies) or kind in (CHUNK, ABORT):
                    lm.copies.append((channel, text, bytes(payload)))
                    return
                break
        lm = Logical(rid, to_d, group, [(channel, text, bytes(payload))], tick=self.tick)
        if self.group_of is not None and kind in (ACK, NACK):
            self._verdict(lm, header.get("epoch"))
        else:
            self._add(lm)

    def _add(self, lm: Logical) -> None:
        """A spec message in flight, with the group messages across the sides its step
        sent before it (``crossing``)."""
        keep = []
        for rid, to_d, ch, text in self.crossing:
            if rid == lm.rid and to_d == lm.to_d and lm.tick == self.tick:
                lm.copies.append((ch, text, b""))
            else:
                keep.append((rid, to_d, ch, text))
        self.crossing = keep
        self.flight.append(lm)

    def flush(self) -> int:
        """The step's group messages across the sides that no spec message of the step
        took: there at once (they have no spec message); returns how many."""
        for _, _, ch, text in self.crossing:
            self._delivered.setdefault(ch, []).append((text, b""))
        n, self.crossing = len(self.crossing), []
        return n

    def _verdict(self, lm: Logical, epoch: Any) -> None:
        """Decode ranks: the decode worker's one verdict leaves once every decode rank
        replied, or at once with a nack (the spec's Ack is sent only at the commit, once
        every rank installed; a rank's ack before its siblings' is held here till then)."""
        key = (lm.rid, epoch)
        held = self.held.pop(key, None)
        if held is not None:
            held.copies += lm.copies
            held.group, held.tick, lm = lm.group, lm.tick, held
        kinds = {json.loads(t).get("type") for _, t, _ in lm.copies}
        ranks = {ch.rpartition(">")[0].rpartition("@")[2] for ch, _, _ in lm.copies}
        if NACK in kinds or len(ranks) >= self.dst_ranks:
            self._add(lm)
        else:
            self.held[key] = lm

    def _group_message(
        self, channel: str, header: Mapping[str, Any], text: str, rid: str, to_d: bool
    ) -> bool:
        """A rank group's message: there at once, or with its step's spec message (see
        the module doc). False if ``channel`` is not a group channel."""
        side = self.group_of(channel) if self.group_of is not None else None
        if side is None:
            return False
        own = str(header.get("from", "")).startswith("decode" if side == "d" else "prefill")
        for lm in reversed(self.flight if not own else []):
            if lm.rid == rid and lm.to_d == to_d and lm.tick == self.tick:
                lm.copies.append((channel, text, b""))
                return True
        if own:
            self._delivered.setdefault(channel, []).append((text, b""))
        else:  # with the step's next spec message that way, else at the step's end
            self.crossing.append((rid, to_d, channel, text))
        return True

    def poll(self, channel: str) -> list[Message]:
        got = self._delivered.pop(channel, [])
        return [(json.loads(text), data) for text, data in got]

    def abort(self, channel: str) -> int:
        """Revoke the chunks in flight on ``channel`` (posted control messages stay); on
        an unrevocable transport none (they land or fail on their own)."""
        if not self.revocable:
            return 0
        before = len(self.flight)
        self._take(lambda lm, ch: lm.group[0] == CHUNK and ch == channel)
        left = [(t, d) for t, d in self._delivered.get(channel, []) if '"type":"chunk"' not in t]
        self._delivered[channel] = left
        return before - len(self.flight)

    def writes_pending(self, channel: str, epoch: int) -> int:
        """Writes (chunks) of ``epoch`` on ``channel`` in flight: the spec's
        ``chunks_in_flight`` (every rank's: the spec's prefill is one worker)."""
        return sum(
            1
            for lm in self.flight
            if lm.group[:2] == (CHUNK, epoch) and any(ch == channel for ch, _, _ in lm.copies)
        )

    def revoke(self, channel: str, epoch: int, rank: int) -> int:
        """Revoke ``rank``'s chunks of ``epoch`` in flight on ``channel`` (a revocable
        transport: the spec's flush of a sender's own writes); none if unrevocable."""
        if not self.revocable:
            return 0
        before = len(self.flight)
        rank = self.rank_of(channel, rank)
        self._take(lambda lm, ch: lm.group[:3] == (CHUNK, epoch, rank) and ch == channel)
        return before - len(self.flight)

    def _take(self, gone: Callable[[Logical, str], bool]) -> None:
        """Take back the copies ``gone`` names (a message with none left is gone)."""
        for lm in list(self.flight):
            lm.copies = [c for c in lm.copies if not gone(lm, c[0])]
            if not lm.copies:
                self.flight.remove(lm)

    # ------------------------------------------------------------ the environment
    def deliver(self, lm: Logical) -> None:
        self.flight.remove(lm)
        for ch, text, data in lm.copies:
            self._delivered.setdefault(ch, []).append((text, data))

    def lose(self, lm: Logical) -> None:
        self.flight.remove(lm)

    def duplicate(self, lm: Logical) -> None:
        self.flight.append(Logical(lm.rid, lm.to_d, (*lm.group, "dup"), list(lm.copies)))

    def corrupt(self, lm: Logical) -> None:
        """Flip the middle byte of the message's first payload (one chunk of its layers)."""
        ch, text, data = lm.copies[0]
        buf = bytearray(data)
        buf[len(buf) // 2] ^= 0xFF
        lm.copies[0] = (ch, text, bytes(buf))

    def mismatch(self, lm: Logical) -> None:
        """Rewrite the manifest as a peer of another model would send it (every copy:
        decode ranks, each sub-handoff's)."""
        for k, (ch, text, data) in enumerate(lm.copies):
            h = json.loads(text)
            if "manifest" not in h:  # a rank group's message sent with it
                continue
            h["manifest"]["model_id"] = str(h["manifest"].get("model_id")) + "-other"
            lm.copies[k] = (ch, json.dumps(h, separators=(",", ":")), data)

    def drop(self, keep: Callable[[Logical], bool]) -> None:
        """A crash: the messages ``keep`` refuses are gone (delivered, unread ones too)."""
        self.flight = [lm for lm in self.flight if keep(lm)]
        self.held = {k: lm for k, lm in self.held.items() if keep(lm)}
        self.crossing = [x for x in self.crossing if keep(Logical(x[0], x[1], ("?",), []))]
        for ch in list(self._delivered):
            rid, to_d = self.rid_of(ch)
            probe = Logical(rid, to_d, ("?",), [])
            if not keep(probe):
                self._delivered.pop(ch)

    # ------------------------------------------------------------ names
    def code(
        self, lm: Logical, per_rank: int, bad_manifest: Callable[[dict[str, Any]], bool]
    ) -> int:
        """The spec's code of a logical message, named from its bytes."""
        h = lm.header
        kind, inc = h.get("type"), int(h.get("inc", 0))  # a write: its target's
        if kind in (CHUNK, SEAL):
            rank = self.rank_of(lm.copies[0][0], int(h["rank"]))
        if kind == CHUNK:
            corrupt = any(
                bytes_checksum(d) != json.loads(t).get("checksum") for _, t, d in lm.copies
            )
            hit = self.hit_of(lm.rid, int(h["epoch"]))
            idx = rank * (per_rank - hit) + int(h["block_index"]) - hit
            return msg(M_CHUNK_BAD if corrupt else M_CHUNK, int(h["epoch"]), idx, inc)
        if kind == MANIFEST:
            mf = h["manifest"]
            bad = M_HANDOFF_BAD if bad_manifest(mf) else M_HANDOFF
            return msg(bad, int(mf["epoch"]), 0, inc)
        if kind == ABORT:
            return msg(M_QUIESCED, int(h["epoch"]), 0, inc)
        idx = rank if kind == SEAL else self.hit_of(lm.rid, int(h["epoch"])) if kind == READY else 0
        if kind == ACK and any(json.loads(t).get("type") == NACK for _, t, _ in lm.copies):
            kind = NACK  # decode ranks: a rank's nack in the step ends the attempt (no Ack)
        return msg(CONTROL_KINDS[str(kind)], int(h["epoch"]), idx, inc)

    def find(
        self,
        rid: str,
        code: int,
        per_rank: int,
        bad_manifest: Callable[[dict[str, Any]], bool],
    ) -> Logical | None:
        for lm in self.flight:
            if lm.rid == rid and self.code(lm, per_rank, bad_manifest) == code:
                return lm
        return None
