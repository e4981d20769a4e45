"""The receiver's quarantine: writes that cannot be taken back (spec
``Config.revocable=False``). A transport says so with ``revocable = False`` (one-sided
RDMA writes, a NIXL or Mooncake batch: ``refimpl.transport``;
``spec/behaviours/irrevocable.py``). Then:

- the ``Receiver`` that gives up an attempt while some of its chunks have not landed
  (an abort, its timeout, a bad chunk or manifest, the engine's ``fail``) cannot fence
  the writer's writes: it keeps the attempt's blocks *quarantined* (``quarantine``,
  ``give_back``: never reused, never read; ``Receiver.held()`` still names them,
  ``quarantined()`` lists them, ``forget`` keeps them) until the writer says
  ``Quiesced`` (the sender's abort of that epoch: every write it issued has landed or
  failed), and only then frees them (``quiesce``, ``release``: the spec's
  ``DecodeAbort`` quarantine and ``DecodeReclaim``; never ``DecodeAbortFenced``). When
  each source rank is its own ``Sender`` (a ranked attempt) every rank's Quiesced is
  needed: one rank's says nothing of its siblings' writes. A second ``Receiver.abort``
  of the quarantined attempt frees them too: the engine's longer quarantine timer, past
  the sender's own timeout and the transport's bound on a write's lifetime (the spec's
  second ``DecodeTimeout``). A write that lands meanwhile is recorded, never installed
  (``on_quarantined``). A newer attempt's manifest that comes meanwhile waits (the
  spec's ``DecodeReserve`` and ``DecodeReject`` need the request's blocks gone): it is
  taken at the first ``poll`` after the quarantine is over (``deferred``), never beside
  it.
- the ``Sender`` whose attempt the receiver nacked, or that aborts, tells it
  ``Quiesced`` (``quiesced``; the spec's ``PrefillResume``, ``PrefillTimeout``) once
  none of its writes of the attempt is pending at the transport (``writes_pending``;
  ``refimpl.api.ends``).

Bug switch ``free_quarantine_early`` (``switches``): the Receiver frees a
quarantined attempt's blocks at once, before Quiesced (the spec's
``free_on_cancel_in_flight``): a late write lands in blocks another request may own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from refimpl.api import wire
from refimpl.api.intake import Attempt, chunks_left, on_manifest, revocable, send_quietly
from refimpl.api.switches import FREE_QUARANTINE_EARLY
from refimpl.api.wire import ABORT, CHUNK, channels
from refimpl.checksum import bytes_checksum
from refimpl.errors import ChecksumError, OwnershipError

if TYPE_CHECKING:
    from refimpl.api.receiver import Receiver


@dataclass
class Late:
    """Writes of a quarantined attempt that landed after it ended (never installed)."""

    epoch: int
    chunks: set[tuple[int, int]] = field(default_factory=set)  # (rank, block index)
    corrupt: bool = False  # one of them did not hash to its header's checksum
    held: bool = True  # its blocks are still quarantined
    ranks: frozenset[int] | None = None  # one Sender per source rank: each must quiesce
    quiet: set[int] = field(default_factory=set)  # the ranks that said Quiesced
    manifest: dict[str, Any] | None = None  # a newer attempt's, come meanwhile: it waits


def quarantine(rx: Receiver, a: Attempt, err: OwnershipError) -> bool:
    """On an unrevocable transport, keep ``a``'s blocks quarantined while a write may
    still land (its bad chunk, if ``err`` is one, has landed); True if it did."""
    if revocable(rx.transport) or FREE_QUARANTINE_EARLY in rx.mutants:
        return False
    if chunks_left(a) <= (1 if isinstance(err, ChecksumError) else 0):
        return False  # every write has landed: nothing can land in the blocks any more
    rid = a.m.request_id
    rx.pools.alloc.quarantine(rid)
    ranks = frozenset(a.ranks) if a.ranked else None
    rx._late[rid] = Late(a.m.epoch, ranks=ranks)  # noqa: SLF001 - the Receiver's own record
    return True


def give_back(rx: Receiver, a: Attempt, err: OwnershipError) -> None:
    """The blocks of ``a``, which ``err`` ended, go back to the pool and its channel is
    voided (its chunks in flight dropped, its epoch fenced); or, on an unrevocable
    transport while a write may still land, they stay quarantined and the channel open
    (its late writes and the writer's Quiesced must arrive: ``release`` fences it)."""
    if quarantine(rx, a, err):
        return
    rid, alloc = a.m.request_id, rx.pools.alloc
    alloc.quarantine(rid)  # reserved blocks: no reader, no reuse yet
    alloc.unquarantine_and_free(rid, a.m.epoch)  # installs are synchronous: all done
    rx.transport.abort(channels(rid).to_receiver)
    wire.fence(rx.transport, channels(rid).to_receiver, a.m.epoch)  # late chunks too


def on_quarantined(rx: Receiver, rid: str, header: dict[str, Any], payload: Any) -> bool:
    """A message for a quarantined attempt: a late write (recorded) or the writer's
    Quiesced (the blocks are free); True if it was one (handled)."""
    late = rx._late.get(rid)  # noqa: SLF001
    if late is None or not late.held or wire.epoch_of(header) != late.epoch:
        return False
    kind = header.get("type")
    if kind == CHUNK:
        rank, idx = header.get("rank"), header.get("block_index")
        if type(rank) is int and type(idx) is int:
            late.chunks.add((rank, idx))
            late.corrupt |= bytes_checksum(bytes(payload)) != header.get("checksum")
        return True
    if kind == ABORT:
        quiesce(rx, rid, header)
        return True
    return False


def quiesce(rx: Receiver, rid: str, header: dict[str, Any]) -> None:
    """A writer's Quiesced (its abort) for ``rid``'s quarantine: freed once every source
    rank's Sender said it (one Sender of every rank: its one abort)."""
    late = rx._late.get(rid)  # noqa: SLF001
    if late is None or not late.held or wire.epoch_of(header) != late.epoch:
        return
    if late.ranks is not None and type(r := header.get("rank")) is int and r in late.ranks:
        late.quiet.add(r)
    if late.ranks is None or late.quiet >= late.ranks:
        release(rx, rid)


def drop_late(rx: Receiver, rid: str) -> None:
    """Forget ``rid``'s quarantine record, unless its blocks are still quarantined or a
    manifest waits on it."""
    late = rx._late.get(rid)  # noqa: SLF001
    if late is not None and not late.held and late.manifest is None:
        del rx._late[rid]  # noqa: SLF001


def deferred(rx: Receiver, rid: str) -> None:
    """A manifest that came while ``rid``'s quarantine held its blocks, once it is over:
    taken now as if it came now (``on_manifest``: reserved and readied, or refused)."""
    late = rx._late.get(rid)  # noqa: SLF001
    if late is None or late.held or late.manifest is None:
        return
    header, late.manifest = late.manifest, None
    drop_late(rx, rid)
    on_manifest(rx, rid, header, rx._att.get(rid))  # noqa: SLF001


def release(rx: Receiver, rid: str) -> None:
    """Free a quarantined attempt's blocks (Quiesced, or the longer quarantine timer)."""
    late = rx._late.get(rid)  # noqa: SLF001
    if late is not None and late.held:
        rx.pools.alloc.unquarantine_and_free(rid, late.epoch)
        late.held = False
        wire.fence(rx.transport, channels(rid).to_receiver, late.epoch)  # late duplicates


def quiesced(
    transport: Any, rid: str, epoch: int, inc: int, reasons: list[str], rank: int | None = None
) -> None:
    """The Sender's (of source rank ``rank`` alone, if one) Quiesced for ``epoch`` of
    ``rid`` (an abort header), on an unrevocable transport only (a revocable one took its
    writes back)."""
    if revocable(transport):
        return
    header: dict[str, Any] = {"type": ABORT, "request_id": rid, "epoch": epoch, "reasons": reasons}
    if rank is not None:
        header["rank"] = rank
    wire.stamp(header, inc)
    send_quietly(transport, channels(rid).to_receiver, header)
