"""How a ``Sender``'s attempt ends other than by the ack: an abort (its own, a sibling
rank's), a nack, a disagreement of the ranks (a mixin of ``refimpl.api.sender``).

On a transport whose writes cannot be taken back (``revocable = False``) an attempt
whose writes are still pending at the transport (``writes_pending``: posted, neither
landed nor failed) cannot end yet: the writes still read its source blocks and may land
in the receiver's. So a nack, the Sender's own ``abort`` (a cancel, a timeout) or a
sibling rank's abort is *pending* (``_Offer.nacked``, ``_Offer.aborting``): the attempt
keeps its state and its pins, ignores every other reply, and ends at the first ``poll``
(or ``abort``) that finds none of its writes pending. Then it says so to the receiver
(the spec's ``PrefillResume`` after a nack, ``PrefillTimeout`` after an abort, refused
``FrozenSnapshot`` / ``NoReuseUnderIO`` while a write is in flight): its abort message
is the writer's ``Quiesced`` (one per prefill rank when each rank is its own Sender:
the receiver holds its quarantine until every rank said it, ``quarantine.quiesce``). An
abort of its own reaches the sibling ranks at once (they stop sending and wait for
their own writes), the receiver only once its writes are over.

Bug switches (``refimpl.api.switches``): ``quiesced_at_nack`` ends a nacked attempt at
once, ``quiesced_at_abort`` an aborted one.
"""

from __future__ import annotations

from refimpl.api.geometry import KVGeometry
from refimpl.api.intake import revocable, send_quietly
from refimpl.api.stream import _Offer
from refimpl.api.switches import QUIESCED_AT_ABORT, QUIESCED_AT_NACK
from refimpl.api.unrevocable.quarantine import quiesced
from refimpl.api.wire import ABORT, Incarnations, State, channels, revoke, stamp, writes_pending
from refimpl.transport import Transport

__all__ = ["AttemptEnds"]


class AttemptEnds:
    """The ends of a ``Sender``'s attempt but the ack (``abort``, a nack, a sibling's
    abort, the ranks' disagreement), each pending while its writes are (see above)."""

    rank: int | None
    geometry: KVGeometry
    transport: Transport
    mutants: frozenset[str]
    inc: Incarnations
    _offers: dict[str, _Offer]

    def _end(self, o: _Offer, state: State, reasons: list[str]) -> None: ...

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """End the attempt here (cancel, timeout): drop the pins, tell the receiver (and,
        one rank of several, every sibling rank: they end with this rank's reason). On
        an unrevocable transport while its writes are pending, only the sibling ranks are
        told now; the attempt and its pins stay until they are over, then a ``poll`` (or
        another ``abort``) ends it and tells the receiver (its ``Quiesced``)."""
        o = self._offers.get(request_id)
        if o is None or o.state.final:
            return
        if o.aborting is None:
            o.aborting = [reason if self.rank is None else f"rank {self.rank} aborted: {reason}"]
            if self.rank is not None:  # the siblings stop now; each waits for its own writes
                self._tell(o.request_id, o.epoch, o.aborting, receiver=False)
        self._settle(o)

    def _settle(self, o: _Offer) -> None:
        """A pending abort or nack of ``o`` ends it once none of its writes is pending
        at the transport (at once on a revocable one, or with the bug switch)."""
        if o.state.final or (o.aborting is None and o.nacked is None):
            return
        early = QUIESCED_AT_ABORT if o.aborting is not None else QUIESCED_AT_NACK
        ch = channels(o.request_id).to_receiver
        wait = o.aborting is None or not revocable(self.transport)  # else its writes revoked
        if early not in self.mutants and wait and writes_pending(self.transport, ch, o.epoch):
            return  # a write still reads the source and may land in the receiver's blocks
        if o.aborting is not None:
            told, why = o.told, o.aborting
            self._end(o, told or State.ABORTED, why)
            if not revocable(self.transport):
                pass  # none can be taken back (and none is pending, but with the switch)
            elif self.rank is None:  # chunks in flight are void (a rank's channel is shared)
                self.transport.abort(ch)
            else:  # this rank's own chunks in flight, the transport revokes them
                revoke(self.transport, ch, o.epoch, self.rank)
            if told:  # a sibling's abort: this rank's Quiesced, on an unrevocable transport
                quiesced(self.transport, o.request_id, o.epoch, self.inc.own, why, self.rank)
            else:
                self._tell(o.request_id, o.epoch, why, siblings=False)
            return
        assert o.nacked is not None
        final, reasons, _ = o.nacked
        self._end(o, final, reasons)
        quiesced(self.transport, o.request_id, o.epoch, self.inc.own, o.reasons, self.rank)

    def _heard_abort(self, o: _Offer, final: State, reasons: list[str]) -> None:
        """A sibling rank's (or the receiver's) abort of ``o``: it ends, once its writes
        are over on an unrevocable transport (then says ``Quiesced`` to the receiver)."""
        if revocable(self.transport):
            self._end(o, final, reasons)
            return
        o.aborting, o.told = reasons, final
        self._settle(o)

    def _tell(
        self,
        rid: str,
        epoch: int,
        reasons: list[str],
        *,
        receiver: bool = True,
        siblings: bool = True,
    ) -> None:
        """An abort at ``epoch`` to the receiver and to every sibling rank (best effort:
        a channel the transport cannot reach is skipped, the others still hear)."""
        ch, header = channels(rid), {"type": ABORT, "request_id": rid, "epoch": epoch}
        stamp(header, self.inc.own)
        tos = [ch.to_receiver] if receiver else []
        if self.rank is not None:
            if siblings:
                tos += [ch.to_rank(s) for s in range(self.geometry.tp) if s != self.rank]
            header["rank"] = self.rank
        for to in tos:
            send_quietly(self.transport, to, {**header, "reasons": reasons})

    def _disagree(self, o: _Offer, epoch: int, live: bool) -> None:
        """This rank offered ``o.epoch`` but the receiver (or a sibling) speaks of the
        newer ``epoch``: the ranks disagree on the attempt. End it here with both epochs
        named; if the receiver's attempt is live, abort it too (every rank hears)."""
        why = [
            f"[RankAgreement] rank {self.rank} offered epoch {o.epoch} of "
            f"{o.request_id!r}, but the attempt the others run is epoch {epoch}"
        ]
        self._end(o, State.ABORTED, why)
        if live:
            self._tell(o.request_id, epoch, why)
