"""Ranks agree: one epoch per attempt for every prefill rank, one ``Receiver`` per
decode rank, and any rank's end reaches every rank of both sides with its reason.

``Epochs(store)`` is the one place an attempt's epoch is chosen: the router (or whoever
retries) calls ``open(rid)`` once per attempt, and every prefill rank's ``RankSender``
offers ``current(rid)``, read from the same store (a ``torch.distributed`` store: the
router's ``TCPStore`` across processes, a ``HashStore`` in one), so a restarted rank
offers what its siblings offer; no rank picks an epoch alone.

A handoff from prefill TP P to decode TP D with each rank in its own process is one
sub-handoff per decode rank d: request ``f"{rid}@{d}"``, the heads decode rank d holds,
sent by the prefill ranks that hold them (``spec.shardmap.tp_reshard_plan``), each only
its slice of them (no rank sends a decode rank heads it does not hold, so no Q-fold
bytes), over the usual ``Sender(rank=i)`` / ``Receiver`` conversation of
``refimpl.api.wire`` (checked, sealed, committed the usual way). A decode-side prefix
(``expect(prefix=...)``) is skipped per decode rank. Above the sub-handoffs each rank has
a group channel (``group_channel``) on which it hears the others:

    offer      a prefill rank's epoch: a rank at another epoch ends the attempt, naming
               both ranks and epochs (``RankAgreement``), never a bare timeout
    installed  a decode rank committed its heads; the request is ready (``ready``) only
               once every decode rank has, and a prefill rank is DONE only then
    abort      any rank's end (cancel, refusal, checksum, a failed peer), with its
               reason: every rank ends its part at once, a decode rank that had
               committed gives its blocks back

A peer's process that the transport reports gone (``DistTransport.failed``) ends the
attempt on every rank that sees it, with that reason, at its next ``poll``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from refimpl.api.intake import send_quietly
from refimpl.api.wire import ABORT, State, epoch_of, fence, reasons_of
from refimpl.transport import Transport
from spec import shardmap as sm

__all__ = ["Epochs", "group_channel", "rank_route", "sub_id"]

OFFER, INSTALLED = "offer", "installed"
MAX_EARLY = 64  # group messages a decode rank keeps for an attempt it has not seen yet


class Epochs:
    """The attempt epochs of requests, one counter per request in a shared store."""

    def __init__(self, store: Any = None, prefix: str = "kvown/epoch/") -> None:
        """``store``: a ``torch.distributed`` Store shared by every rank (default: a
        ``HashStore``, for ranks in one process)."""
        if store is None:
            import torch.distributed as dist

            store = dist.HashStore()
        self.store, self.prefix = store, prefix

    def open(self, request_id: str) -> int:
        """Begin a new attempt of the request (its first, a retry, after a restart)."""
        return int(self.store.add(self.prefix + request_id, 1))

    def current(self, request_id: str) -> int:
        """The epoch of the request's newest attempt (ValueError if none was opened)."""
        e = int(self.store.add(self.prefix + request_id, 0))
        if e < 1:
            raise ValueError(f"{request_id!r}: no attempt opened (Epochs.open) to offer")
        return e


def sub_id(request_id: str, dst_rank: int) -> str:
    """The request id of decode rank ``dst_rank``'s sub-handoff (its blocks' holder)."""
    return f"{request_id}@{dst_rank}"


def group_channel(request_id: str, side: str, rank: int) -> str:
    """Rank ``rank`` of side ``"p"`` (prefill) or ``"d"`` (decode): its group channel."""
    return f"kv:{request_id}>{side}{rank}"


def _pieces(kv_heads: int, src_tp: int, dst_tp: int, dst: int) -> list[sm.HeadPiece]:
    for n, tp in (("prefill", src_tp), ("decode", dst_tp)):
        if kv_heads % tp:
            raise ValueError(f"{kv_heads} KV heads over {n} TP {tp}: ranks per head not handled")
    plan = [p for p in sm.tp_reshard_plan(kv_heads, src_tp, dst_tp) if p.dst_rank == dst]
    return sorted(plan, key=lambda p: p.dst_start)


def rank_route(prefill: Sequence[int], decode: Sequence[int], kv_heads: int) -> Any:
    """``DistTransport``'s route for rank groups: prefill rank r is group rank
    ``prefill[r]``, decode rank d ``decode[d]``; sub-handoff, group channels both."""

    def route(channel: str) -> int:
        head, _, tail = channel.rpartition(">")
        if tail[:1] in ("p", "d") and tail[1:].isdigit():
            ranks = prefill if tail[0] == "p" else decode
            if int(tail[1:]) < len(ranks):
                return ranks[int(tail[1:])]
        _, at, d = head.rpartition("@")
        if at and d.isdigit() and int(d) < len(decode):
            if tail == "rx":
                return decode[int(d)]
            if tail.startswith("tx") and tail[2:].isdigit():
                pieces = _pieces(kv_heads, len(prefill), len(decode), int(d))
                if int(tail[2:]) < len(pieces):
                    return prefill[pieces[int(tail[2:])].src_rank]
        raise ValueError(f"channel {channel!r} is not a rank group's channel")

    return route


@dataclass
class _Group:
    """One request's attempt as this rank sees the group."""

    epoch: int
    state: State
    reasons: list[str] = field(default_factory=list)
    installed: set[int] = field(default_factory=set)  # decode ranks that committed
    told: bool = False  # this decode rank said "installed"
    other: int | None = None  # the epoch another rank is at (the ranks disagree): ended too


class _Member:
    """What a prefill and a decode rank share: the group channels, the group's end."""

    side, rank, src_tp, dst_tp = "p", 0, 1, 1
    transport: Transport

    def _all(self, rid: str) -> list[str]:
        ps = [group_channel(rid, "p", r) for r in range(self.src_tp)]
        return ps + [group_channel(rid, "d", d) for d in range(self.dst_tp)]

    def _others(self, rid: str) -> list[str]:
        me = group_channel(rid, self.side, self.rank)
        return [c for c in self._all(rid) if c != me]

    def _say(self, rid: str, header: dict[str, Any]) -> None:
        who = f"{'prefill' if self.side == 'p' else 'decode'} rank {self.rank}"
        for to in self._others(rid):
            send_quietly(self.transport, to, {**header, "from": who})

    def _heard(self, rid: str) -> list[dict[str, Any]]:
        msgs = self.transport.poll(group_channel(rid, self.side, self.rank))
        return [h for h, _ in msgs if isinstance(h, dict)]

    def _failed(self, rid: str) -> str:
        f = getattr(self.transport, "failed", None)
        return next((w for c in self._others(rid) if (w := f(c))), "") if f is not None else ""

    def _done(self, rid: str, g: _Group) -> None:
        """Every rank is through: the attempt is done here; its late messages are void."""
        g.state = State.DONE
        fence(self.transport, group_channel(rid, self.side, self.rank), g.epoch)

    def _drop(self, rid: str) -> None:
        """Forget: whatever still waits on this rank's group channel goes too."""
        self.transport.abort(group_channel(rid, self.side, self.rank))

    def _end_group(self, rid: str, g: _Group, reasons: list[str], tell: bool) -> None:
        g.state, g.reasons = State.ABORTED, reasons
        for e in sorted({g.epoch, g.other or g.epoch}) if tell else ():  # both attempts end
            self._say(rid, {"type": ABORT, "epoch": e, "reasons": reasons})
        fence(self.transport, group_channel(rid, self.side, self.rank), g.epoch)

    def _hear(self, rid: str, g: _Group, h: dict[str, Any]) -> list[str] | None:
        """One group message for the live attempt ``g``: the reasons to end it, if any."""
        e, kind, who = epoch_of(h), h.get("type"), str(h.get("from"))[:40]
        if e is None or e < g.epoch:
            return None  # an older attempt's: fenced
        if e > g.epoch or (kind == OFFER and e != g.epoch):
            g.other = e
            return [
                f"[RankAgreement] {rid!r}: {who} is at epoch {e}, but "
                f"{'prefill' if self.side == 'p' else 'decode'} rank {self.rank} at {g.epoch}"
            ]
        if kind == ABORT:
            return reasons_of(h) or [f"{who} aborted"]
        if kind == INSTALLED and type(h.get("rank")) is int and 0 <= h["rank"] < self.dst_tp:
            g.installed.add(h["rank"])
        return None
