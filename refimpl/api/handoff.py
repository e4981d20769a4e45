"""``handoff()``: one request's KV from a ``Sender`` to a ``Receiver`` in one call
(``Handoff``: the same in steps).

It plays both ends of the conversation of ``refimpl.api.wire`` over the shared transport
until both have ended. When a full round moves no message (a chunk or reply was lost, a
peer crashed), both ends abort with ``"timeout"``: every end gives back what it held, so a
failed handoff leaves nothing held on either side. The receiver's error is raised
(``ManifestError``, ``CapacityError``, ``ChecksumError``, ``CancelledError``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from refimpl.api.receiver import Received, Receiver
from refimpl.api.sender import Sender
from refimpl.api.wire import State
from refimpl.errors import CancelledError


@dataclass(frozen=True, slots=True)
class HandoffResult:
    """A committed handoff and what it cost on the wire."""

    received: Received  # the receiver's blocks of the request, owned by it now
    chunks: int  # chunk messages sent
    bytes_sent: int  # chunk payload bytes
    rounds: int  # poll rounds the conversation took
    checks: int  # checksum comparisons that passed at the receiver


class Handoff:
    """One handoff in steps, for an engine that interleaves it with its own work (the
    offload/reload of ``refimpl.api.offload`` are ones; ``handoff()`` runs one to its end):

        h = Handoff(sender, receiver, "req-1", token_ids)  # expect, offer: the source frozen
        while not h.final: h.round()                       # one poll of each end
        got = h.result()                                    # or its error, raised
        got = h.run()                                       # the same, with the timeout
        h.abort("cancelled")                                # either end gives back all it held

    The arguments are ``handoff()``'s."""

    def __init__(
        self,
        sender: Sender,
        receiver: Receiver,
        request_id: str,
        token_ids: Sequence[int],
        *,
        blocks: Sequence[int] | None = None,
        epoch: int | None = None,
        decode_room: int = 0,
        prefix: Sequence[int] = (),
        prefix_tokens: Sequence[int] | None = None,
        free_source: bool = True,
        layered: bool = False,
        dst_blocks: Sequence[int] | None = None,
        checksums: Sequence[str] | None = None,
    ) -> None:
        rx_bs, tx_bs = receiver.geometry.block_size, sender.geometry.block_size
        if len(prefix) * rx_bs % tx_bs:
            raise ValueError(
                f"a prefix of {len(prefix)} x {rx_bs} tokens is not whole {tx_bs}-blocks"
            )
        self.sender, self.receiver, self.request_id = sender, receiver, request_id
        self.free_source, self.rounds = free_source, 0
        receiver.forget(request_id)
        receiver.expect(
            request_id,
            decode_room=decode_room,
            prefix=prefix,
            prefix_tokens=prefix_tokens,
            blocks=dst_blocks,
        )
        sender.offer(
            request_id,
            token_ids,
            blocks=blocks,
            epoch=epoch,
            dst_tp=receiver.geometry.tp,
            dst_cp=receiver.geometry.cp,
            prefix_blocks=len(prefix) * rx_bs // tx_bs,
            free_source=free_source,
            layers=sender.geometry.num_layers if layered else None,
            checksums=checksums,
        )
        for layer in range(sender.geometry.num_layers if layered else 0):
            sender.send_layer(request_id, layer)  # computed already: sent on the ready

    @property
    def final(self) -> bool:
        """Both ends have ended (committed, refused or aborted)."""
        rid = self.request_id
        return self.sender.state(rid).final and self.receiver.state(rid).final

    def round(self) -> int:
        """One poll of the receiver, then of the sender; the messages they read."""
        self.rounds += 1
        return self.receiver.poll(self.request_id) + self.sender.poll(self.request_id)

    def abort(self, reason: str) -> None:
        """Both ends give up (a cancel, a timeout, a failed store): every block either
        end held for it is given back; the sender's source is thawed, not freed."""
        rid = self.request_id
        self.receiver.abort(rid, reason)
        self.sender.abort(rid, reason)
        self.receiver.poll(rid)  # drain the sender's abort

    def run(self, max_idle_rounds: int = 1) -> HandoffResult:
        """Rounds until both ends have ended; ``max_idle_rounds`` rounds in a row that move
        no message (a lost message, a dead peer): both abort with ``"timeout"``."""
        idle = 0
        while not self.final:
            idle = 0 if self.round() else idle + 1
            if idle > max_idle_rounds:
                self.abort("timeout")
        return self.result()

    def result(self) -> HandoffResult:
        """The committed handoff, else the receiver's error (``CancelledError``: the
        sender's). The ack lost: the receiver committed, so the source is freed here."""
        rid, sender, receiver = self.request_id, self.sender, self.receiver
        if receiver.state(rid) is State.DONE:
            if sender.state(rid) is not State.DONE and self.free_source:
                sender.pools.alloc.free(rid)
            chunks, nbytes = sender.stats(rid)
            got = receiver.result(rid)
            return HandoffResult(got, chunks, nbytes, self.rounds, receiver.checks(rid))
        err = receiver.error(rid)
        if err is not None:
            raise err
        raise CancelledError(f"{rid!r}: sender ended {sender.reasons(rid)}")


def handoff(
    sender: Sender,
    receiver: Receiver,
    request_id: str,
    token_ids: Sequence[int],
    *,
    blocks: Sequence[int] | None = None,
    epoch: int | None = None,
    decode_room: int = 0,
    prefix: Sequence[int] = (),
    prefix_tokens: Sequence[int] | None = None,
    free_source: bool = True,
    max_idle_rounds: int = 1,
    layered: bool = False,
    dst_blocks: Sequence[int] | None = None,
    checksums: Sequence[str] | None = None,
) -> HandoffResult:
    """Move ``request_id``'s KV (``token_ids``, held in ``blocks`` at the sender).

    ``decode_room``: tokens of room the receiver reserves after the prompt. ``prefix``:
    blocks the receiver already holds for the leading tokens (its block size); their
    tokens must be whole blocks on both sides, and ``prefix_tokens`` are the token ids
    whose KV they hold (refused unless the manifest starts with them). ``epoch``: default
    the sender's next one for the request, so a retry never shares an old attempt's
    epoch. ``free_source``: the sender frees the
    request's blocks once the receiver acknowledged. ``layered``: the layer-by-layer
    conversation (``offer(..., layers=L)``, every layer already computed: one chunk per
    (rank, layer), each rank's blocks checked against its seal as they land).
    ``dst_blocks``: the receiver's blocks, chosen by its engine (registered memory).
    ``checksums``: the writer's, one per block (``Sender.offer``; whole-block only).
    Raises the refusal or failure after both ends gave back everything they held.
    """
    h = Handoff(
        sender,
        receiver,
        request_id,
        token_ids,
        blocks=blocks,
        epoch=epoch,
        decode_room=decode_room,
        prefix=prefix,
        prefix_tokens=prefix_tokens,
        free_source=free_source,
        layered=layered,
        dst_blocks=dst_blocks,
        checksums=checksums,
    )
    return h.run(max_idle_rounds)
