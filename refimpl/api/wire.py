"""The handoff conversation on a ``Transport``: channel names, message types, states.

Per request, two channels (``channels(rid)``), JSON headers, byte payloads only:

    sender -> receiver (``to_receiver``)   manifest, chunk*, seal*, abort
    receiver -> sender (``to_sender``)     ready | nack, then ack | nack | abort
                    (``to_rank(r)``, to every source rank, when each rank is a Sender)

    S  freeze the blocks to send (pinned, read-only), one xxh3 per canonical block
    S->R  manifest (JSON) ........ R: validate + check_compatible + reserve, or nack
    R->S  ready | nack(reasons) .. S: on nack release the pins (nothing else held)
    S->R  chunk per (primary TP rank, block): raw bytes + their xxh3 in the header
    R     verify each chunk, install it, and only then count it; at the end verify every
          canonical block against the manifest, reshard if the block size differs,
          commit (RESERVED -> OWNED)
    R->S  ack .................... S: release the pins (and free the request if asked)

Layer by layer (``Sender.offer(..., layers=L)`` then ``send_layer`` per layer): the
manifest goes out before the KV exists (its block_checksums are zeros), each chunk is one
(rank, layer) holding that layer of the sent blocks from ``block_index`` (``blocks`` of
them: every sent block, unless ``Sender(..., blocks_per_chunk=k)``), and each source
rank ends with a ``seal`` carrying its blocks' xxh3-64 (``refimpl.api.layers``); the
receiver commits only once every layer landed and every block's digest matched its
seal. With ``Sender(..., rank=r)`` each TP rank is its
own Sender (one process per rank): all offer the same request (same epoch), the first
rank sends the manifest, each sends only its own shards and seal, and every rank gets
every reply.

Every failure ends the attempt on the side that sees it, gives back what it held, and
answers the peer (``nack`` from the receiver, ``abort`` from the sender), so the peer
gives back its part too. A side that hears nothing ends it with ``abort(rid, "timeout")``.
With one Sender per rank, a rank's ``abort`` goes to the receiver and to every sibling
rank's channel, and the receiver answers every rank's channel, so every rank of both
sides ends with the aborting rank's reason. The ranks of an attempt share its epoch; a
rank that hears of a newer one than it offered (or a chunk of a newer one at the
receiver) ends the attempt everywhere with a ``RankAgreement`` reason naming the rank and
both epochs. The side that ended an attempt ``fence``s its inbound channel at the
attempt's epoch: the transport drops its late messages instead of keeping them.

A peer's message is checked before it is used: a header that is not an object is
ignored; an epoch counts only as an int (``true`` and ``1.0`` are not epoch 1), else the
message is another attempt's and fenced; a ``nack`` or ``abort`` whose ``reasons`` is not
a list of strings still ends the attempt, with one reason naming the malformed field.
Each retry of a request is a new attempt with a higher epoch (``Sender.offer`` picks the
next one by default), so nothing of an old attempt is taken by the new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from refimpl.chunks import CHUNK as CHUNK
from refimpl.transport import epoch_of as epoch_of

MANIFEST, READY, NACK, ACK, ABORT = "manifest", "ready", "nack", "ack", "abort"
SEAL = "seal"  # a source rank's chunks and their checksums, after its last layer (streamed)


@dataclass(frozen=True, slots=True)
class Channels:
    """The two channel names of one request's handoff (for fault injection, tracing)."""

    to_receiver: str  # manifest, chunks, abort
    to_sender: str  # ready, nack, ack, abort

    def to_rank(self, rank: int) -> str:
        """The replies' channel of source rank ``rank`` when each rank is its own Sender."""
        return f"{self.to_sender}{rank}"


def channels(request_id: str) -> Channels:
    return Channels(f"kv:{request_id}>rx", f"kv:{request_id}>tx")


class State(Enum):
    """Where one side's attempt stands. DONE, REFUSED and ABORTED are final."""

    OFFERED = "offered"  # sender: manifest sent, waiting for ready/nack
    RECEIVING = "receiving"  # receiver: reserved, chunks arriving
    SENDING = "sending"  # sender: chunks sent, waiting for ack
    DONE = "done"  # committed (receiver) / acknowledged and released (sender)
    REFUSED = "refused"  # the receiver said no before reserving anything kept
    ABORTED = "aborted"  # failed or cancelled after it began; everything given back
    WAITING = "waiting"  # receiver: no manifest for the request yet (or forgotten)

    @property
    def final(self) -> bool:
        return self in (State.DONE, State.REFUSED, State.ABORTED)


def fence(transport: object, channel: str, epoch: int) -> None:
    """Tell the transport that every message of ``epoch`` or older on ``channel`` is
    void from now on (an ended attempt's late messages are dropped, not kept); a
    transport without ``fence`` keeps them until they are polled and fenced here."""
    f = getattr(transport, "fence", None)
    if f is not None:
        f(channel, epoch)


def revoke(transport: object, channel: str, epoch: int, rank: int) -> None:
    """A sender's own writes (chunks) of ``epoch`` from ``rank`` still in flight on
    ``channel`` fail, if the transport can take them back (``revoke``: a revocable
    transport); the spec's flush at ``PrefillTimeout``. Without it they may still land,
    and the receiver fences them once it hears of the abort."""
    f = getattr(transport, "revoke", None)
    if f is not None:
        f(channel, epoch, rank)


def writes_pending(transport: object, channel: str, epoch: int) -> int:
    """A sender's writes of ``epoch`` on ``channel`` that have neither landed nor failed
    (the transport's ``writes_pending``: its batch status); 0 on a transport that does
    not say (a revocable one: the receiver's fence or abort ends them)."""
    f = getattr(transport, "writes_pending", None)
    return int(f(channel, epoch)) if f is not None else 0


def peer_failed(transport: object, tos: list[str]) -> str:
    """Why the process one of ``tos`` routes to failed, if the transport detects it
    (``DistTransport.failed``: its link broke); "" otherwise."""
    f = getattr(transport, "failed", None)
    return next((why for to in tos if (why := f(to))), "") if f is not None else ""


MAX_REASONS, MAX_REASON_CHARS = 64, 1000  # what a peer's reasons may fill, at most


def reasons_of(header: Mapping[str, Any]) -> list[str]:
    """A nack's or abort's reasons, or one reason naming why they are malformed."""
    r = header.get("reasons", [])
    if isinstance(r, list) and len(r) <= MAX_REASONS and all(type(x) is str for x in r):
        return [x[:MAX_REASON_CHARS] for x in r]
    return [f"malformed {header.get('type')!s:.20}: reasons {r!r:.80} is not a list of strings"]


# ---------------------------------------------------------------- incarnations
INC = "inc"  # a message's incarnation (absent: 0): its sender's, a write its target's


def inc_of(header: Mapping[str, Any]) -> int | None:
    """A message's incarnation (0 when absent), or None when it is not an int >= 0."""
    v = header.get(INC, 0)
    return v if type(v) is int and v >= 0 else None


def stamp(header: dict[str, Any], inc: int) -> dict[str, Any]:
    """``header`` with incarnation ``inc`` (left out when 0: a world without restarts
    sends what it sent before)."""
    if inc:
        header[INC] = inc
    return header


def check_incarnation(inc: object, who: str) -> int:
    """An end's incarnation, or ValueError naming it."""
    if type(inc) is not int or inc < 0:
        raise ValueError(f"{who}: incarnation={inc!r} must be an int >= 0 (0: never restarted)")
    return inc


class Incarnations:
    """One end's incarnation (``own``), the newest it knows of its peer's (``peer``: told
    by ``restarted``, or seen on a control message), and the stale messages it refused.

    A control message of an older incarnation than the peer's newest is a dead
    incarnation's; a write (chunk) addressed to another incarnation than ``own`` targets
    a dead registration: both are refused by name (``refused``, the last 64) and change
    nothing (spec/behaviours/restarts.py, ``Fencing``)."""

    def __init__(self, own: int, who: str, accept_stale: bool = False) -> None:
        self.own, self.peer, self.who = check_incarnation(own, who), 0, who
        self.accept_stale = accept_stale  # the stale_incarnation_accepted bug switch
        self.refused: list[str] = []
        self.count = 0

    def restarted(self, inc: int) -> None:
        """The peer's process came back as incarnation ``inc`` (never goes back)."""
        self.peer = max(self.peer, check_incarnation(inc, f"{self.who}.peer_restarted"))

    def stale(self, rid: str, header: Mapping[str, Any]) -> bool:
        """Is ``header`` of a dead incarnation? Then it is named in ``refused``."""
        inc, kind = inc_of(header), header.get("type")
        write = kind == CHUNK
        if inc is not None and not write and inc > self.peer:
            self.peer = inc  # the peer restarted: its newer incarnation speaks
        if inc is None:
            why = f"malformed incarnation {header.get(INC)!r:.40}"
        elif write and inc != self.own:
            why = f"a write to incarnation {inc}'s registration; this is incarnation {self.own}"
        elif not write and inc < self.peer and not self.accept_stale:
            why = f"incarnation {inc}; the peer is at incarnation {self.peer}"
        else:
            return False
        self.count += 1
        self.refused = [*self.refused[-63:], f"[Fencing] {rid!r}: {kind!s:.20} refused: {why}"]
        return True


class Incarnated:
    """What an end with an incarnation (``Sender``, ``Receiver``) tells of it."""

    inc: Incarnations

    @property
    def incarnation(self) -> int:
        return self.inc.own

    def stale(self) -> list[str]:
        """The last messages refused as a dead incarnation's, each named (``[Fencing]``)."""
        return list(self.inc.refused)
