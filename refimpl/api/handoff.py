"""``handoff()``: one request's KV from a ``Sender`` to a ``Receiver`` in one call.

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
    rx_bs, tx_bs = receiver.geometry.block_size, sender.geometry.block_size
    if len(prefix) * rx_bs % tx_bs:
        raise ValueError(f"a prefix of {len(prefix)} x {rx_bs} tokens is not whole {tx_bs}-blocks")
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
    rounds = idle = 0
    while not (sender.state(request_id).final and receiver.state(request_id).final):
        rounds += 1
        moved = receiver.poll(request_id) + sender.poll(request_id)
        idle = 0 if moved else idle + 1
        if idle > max_idle_rounds:
            receiver.abort(request_id, "timeout")
            sender.abort(request_id, "timeout")
            receiver.poll(request_id)  # drain the sender's abort
    if receiver.state(request_id) is State.DONE:
        if sender.state(request_id) is not State.DONE and free_source:
            sender.pools.alloc.free(request_id)  # the ack was lost; the receiver committed
        chunks, nbytes = sender.stats(request_id)
        got = receiver.result(request_id)
        return HandoffResult(got, chunks, nbytes, rounds, receiver.checks(request_id))
    err = receiver.error(request_id)
    if err is not None:
        raise err
    raise CancelledError(f"{request_id!r}: sender ended {sender.reasons(request_id)}")
