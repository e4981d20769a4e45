"""The handoff conversation on a ``Transport``: channel names, message types, states.

Per request, two channels (``channels(rid)``), JSON headers, byte payloads only:

    sender -> receiver (``to_receiver``)   manifest, chunk*, abort
    receiver -> sender (``to_sender``)     ready | nack, then ack | nack | abort

    S  freeze the blocks to send (pinned, read-only), one xxh3 per canonical block
    S->R  manifest (JSON) ........ R: validate + check_compatible + reserve, or nack
    R->S  ready | nack(reasons) .. S: on nack release the pins (nothing else held)
    S->R  chunk per (primary TP rank, block): raw bytes + their xxh3 in the header
    R     verify each chunk, install it, and only then count it; at the end verify every
          canonical block against the manifest, reshard if the block size differs,
          commit (RESERVED -> OWNED)
    R->S  ack .................... S: release the pins (and free the request if asked)

Every failure ends the attempt on the side that sees it, gives back what it held, and
answers the peer (``nack`` from the receiver, ``abort`` from the sender), so the peer
gives back its part too. A side that hears nothing ends it with ``abort(rid, "timeout")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

MANIFEST, CHUNK, READY, NACK, ACK, ABORT = "manifest", "chunk", "ready", "nack", "ack", "abort"


@dataclass(frozen=True, slots=True)
class Channels:
    """The two channel names of one request's handoff (for fault injection, tracing)."""

    to_receiver: str  # manifest, chunks, abort
    to_sender: str  # ready, nack, ack, abort


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

    @property
    def final(self) -> bool:
        return self in (State.DONE, State.REFUSED, State.ABORTED)
