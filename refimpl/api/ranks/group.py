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
    abort      any rank's end (cancel, refusal, checksum, a failed offer, a failed
               peer), with its reason: every rank ends its part at once, a decode rank
               that had committed gives its blocks back; heard before a rank's own part
               began, it ends that attempt there too (its later offer sends nothing)

A peer's process that the transport reports gone (``DistTransport.failed``) ends the
attempt on every rank that sees it, with that reason, at its next ``poll``.

Restarts: each rank has an ``incarnation`` (its process's restarts so far) that its group
messages carry. A restarted prefill rank never offers an epoch its dead incarnation
offered (``Epochs.claim``, recorded in the store before anything is sent): it ends that
attempt on every rank, naming itself, both incarnations and the epoch. A group message
of an older incarnation than the newest known of its rank is refused by name
(``stale()``); a rank heard at two incarnations in one attempt, or a rank of its own
side the engine's membership reports restarted (``peer_restarted``), ends the attempt
the same way (a rank of the other side reported restarted: a fence only, as
``Sender``/``Receiver.peer_restarted``; the sub-handoffs carry each prefill rank's
incarnation and a decode rank fences each prefill rank by its own, ``ranks.fence``). An
abort names the epoch and what the attempt still waited for (``waiting``): a stall that
ends by a timer names its ranks and epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from refimpl.api.intake import send_quietly
from refimpl.api.wire import (
    ABORT,
    State,
    check_incarnation,
    epoch_of,
    fence,
    inc_of,
    reasons_of,
    stamp,
)
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

            store = dist.HashStore()  # type: ignore[attr-defined,unused-ignore]
        self.store, self.prefix = store, prefix

    def open(self, request_id: str) -> int:
        """Begin a new attempt of the request (its first, a retry, after a restart)."""
        return int(self.store.add(self.prefix + request_id, 1))

    def current(self, request_id: str) -> int:
        """The epoch of the request's newest attempt (ValueError if none was opened)."""
        e = self.peek(request_id)
        if e < 1:
            raise ValueError(f"{request_id!r}: no attempt opened (Epochs.open) to offer")
        return e

    def peek(self, request_id: str) -> int:
        """The newest attempt's epoch, 0 if none was opened."""
        return int(self.store.add(self.prefix + request_id, 0))

    def claim(self, request_id: str, rank: int, epoch: int, incarnation: int) -> int | None:
        """Prefill rank ``rank``'s incarnation ``incarnation`` offers ``epoch``: recorded
        in the store before anything is sent. Returns the older incarnation of that rank
        that already offered this epoch (the attempt died with it: it is never offered
        again), else None."""
        key = f"{self.prefix}{request_id}/p{rank}"
        if self.store.check([key]):
            raw = bytes(self.store.get(key)).decode(errors="replace")
            e, _, i = raw.partition(":")
            if not (e.isdigit() and i.isdigit()):
                raise ValueError(f"{key!r} holds {raw!r:.40}, not 'epoch:incarnation'")
            if int(e) == epoch and int(i) != incarnation:
                return int(i)  # the record stays: this epoch is never offered again
        self.store.set(key, f"{epoch}:{incarnation}")
        return None

    def release(self, request_id: str, rank: int) -> None:
        """Prefill rank ``rank`` forgot the request: its ``claim`` record goes (the store
        keeps nothing per request and rank once every rank forgot it)."""
        key = f"{self.prefix}{request_id}/p{rank}"
        if self.store.check([key]):
            self.store.delete_key(key)


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
    offered: set[int] = field(default_factory=set)  # prefill ranks heard offering it
    incs: dict[str, int] = field(default_factory=dict)  # each rank's incarnation in it
    lost: list[str] = field(default_factory=list)  # a rank restarted (peer_restarted)


class _Member:
    """What a prefill and a decode rank share: the group channels, the group's end."""

    side, rank, src_tp, dst_tp = "p", 0, 1, 1
    transport: Transport
    _g: dict[str, _Group]

    def _init_member(self, incarnation: int) -> None:
        self.incarnation = check_incarnation(incarnation, type(self).__name__)
        self._newest: dict[str, int] = {}  # each other rank's newest incarnation known
        self._refused: list[str] = []
        self._early: dict[str, list[dict[str, Any]]] = {}  # group messages before the attempt

    def _me(self) -> str:
        return f"{'prefill' if self.side == 'p' else 'decode'} rank {self.rank}"

    def _names(self) -> set[str]:
        ps = {f"prefill rank {r}" for r in range(self.src_tp)}
        return ps | {f"decode rank {d}" for d in range(self.dst_tp)}

    def stale(self) -> list[str]:
        """The last group messages refused as a dead incarnation's, each named."""
        return list(self._refused)

    def peer_restarted(self, side: str, rank: int, incarnation: int) -> None:
        """Rank ``rank`` of side ``"p"``/``"d"`` came back as ``incarnation`` (the engine's
        membership says so): its older incarnation's group messages are refused by name.
        A rank of this rank's own side (one worker: its crash is the side's): a live
        attempt that rank took part in as an older one ends at the next poll, on every
        rank, naming the rank, its incarnations and the epoch. A rank of the other side:
        a fence only, as ``Sender``/``Receiver.peer_restarted`` (its dead incarnation's
        messages change nothing; an attempt bound to it ends by a timer, or at once by
        the transport's report of the dead process, ``failed``: the spec's
        ``PrefillTimeout``/``DecodeTimeout`` after ``EnvRestart``)."""
        who = f"{'prefill' if side == 'p' else 'decode'} rank {rank}"
        if side not in ("p", "d") or who not in self._names() or who == self._me():
            raise ValueError(f"peer_restarted({side!r}, {rank!r}): not another rank of the group")
        inc = check_incarnation(incarnation, f"{type(self).__name__}.peer_restarted")
        self._newest[who] = max(self._newest.get(who, 0), inc)
        for rid, g in self._g.items() if side == self.side else ():
            if not g.state.final and g.incs.get(who, inc) < inc:
                g.lost = [self._restarted(rid, g, who, g.incs[who], inc)]

    @staticmethod
    def _restarted(rid: str, g: _Group, who: str, was: int, now: int) -> str:
        return (f"[RankAgreement] {rid!r}: {who} restarted (incarnation {was} -> {now}) "
                f"during the attempt at epoch {g.epoch}")  # fmt: skip

    def waiting(self, request_id: str) -> list[str]:
        """What the live attempt here still waits for, each naming a rank and the epoch
        (a stall that ends by a timer says this, never a bare timeout)."""
        g = self._g.get(request_id)
        if g is None or g.state.final:
            return []
        me = {self.rank} if self.side == "p" else set()
        out = [f"prefill rank {r}'s offer at epoch {g.epoch}"
               for r in range(self.src_tp) if r not in g.offered | me]  # fmt: skip
        return out + [f"decode rank {d}'s install at epoch {g.epoch}"
                      for d in range(self.dst_tp) if d not in g.installed]  # fmt: skip

    def _aborted(self, rid: str, reason: str) -> str:
        g, w = self._g.get(rid), self.waiting(rid)
        at = f" (epoch {g.epoch}{'; waiting on ' + ', '.join(w) if w else ''})" if g else ""
        return f"{self._me()} aborted: {reason}{at}"

    def _all(self, rid: str) -> list[str]:
        ps = [group_channel(rid, "p", r) for r in range(self.src_tp)]
        return ps + [group_channel(rid, "d", d) for d in range(self.dst_tp)]

    def _others(self, rid: str) -> list[str]:
        me = group_channel(rid, self.side, self.rank)
        return [c for c in self._all(rid) if c != me]

    def _say(self, rid: str, header: dict[str, Any]) -> None:
        stamped = stamp({**header, "from": self._me()}, self.incarnation)
        for to in self._others(rid):
            send_quietly(self.transport, to, stamped)

    def _heard(self, rid: str) -> list[dict[str, Any]]:
        """This rank's group messages, less a dead incarnation's (named in ``stale``)."""
        msgs = self.transport.poll(group_channel(rid, self.side, self.rank))
        out = []
        for h, _ in msgs:
            if not isinstance(h, dict):
                continue
            who, inc = h.get("from"), inc_of(h)
            if isinstance(who, str) and who in self._names():
                newest = self._newest.get(who, 0)
                if inc is None or inc < newest:
                    was = h.get("inc") if inc is None else inc
                    why = f"incarnation {was!r:.20}; {who} is at incarnation {newest}"
                    why = f"[Fencing] {rid!r}: {h.get('type')!s:.20} refused: {why}"
                    self._refused = [*self._refused[-63:], why]
                    continue
                self._newest[who] = inc
            out.append(h)
        return out

    def _before(self, rid: str, heard: list[dict[str, Any]], now: int) -> None:
        """No attempt here yet: an abort heard (or a failed peer) ends the attempt it
        names here too, before it starts (at ``now`` for a failed peer: the newest
        attempt's epoch); anything else waits for this rank's attempt."""
        aborts = [h for h in heard if h.get("type") == ABORT]
        why = (reasons_of(aborts[0]) or ["aborted"]) if aborts else None
        why = why or ([w] if (w := self._failed(rid)) else None)
        if why is None:
            self._keep_early(rid, heard)
            return
        e = max((epoch_of(h) or 0 for h in aborts), default=now)
        self._g[rid] = _Group(e, State.ABORTED, why)
        self._early.pop(rid, None)

    def _early_then(self, rid: str, heard: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages kept from before this rank's attempt, then ``heard``."""
        return self._early.pop(rid, []) + heard

    def _keep_early(self, rid: str, heard: list[dict[str, Any]]) -> None:
        """The others may be ahead: their messages wait for this rank's attempt (bounded)."""
        self._early.setdefault(rid, []).extend(heard)
        del self._early[rid][:-MAX_EARLY]

    def _failed(self, rid: str) -> str:
        f = getattr(self.transport, "failed", None)
        return next((w for c in self._others(rid) if (w := f(c))), "") if f is not None else ""

    def _done(self, rid: str, g: _Group) -> None:
        """Every rank is through: the attempt is done here; its late messages are void."""
        g.state = State.DONE
        fence(self.transport, group_channel(rid, self.side, self.rank), g.epoch)

    def _drop(self, rid: str, floor: int = 0) -> None:
        """Forget: what waits for this rank of the attempts it ends goes too (its group
        channel's messages of their epoch or older, fenced), never a newer attempt's: a
        faster rank's "installed" (or offer, or abort) of the next attempt, heard before
        this rank's part of it came, stays for that attempt (forget dropped it, and the
        rank never became ready). ``floor``: an attempt the engine said it took (the
        epoch ``expect`` named), ended too. Call it before ``self._g`` forgets."""
        g = self._g.get(rid)
        e = max(g.epoch if g is not None else 0, floor)
        if e > 0:
            fence(self.transport, group_channel(rid, self.side, self.rank), e)
        newer = [h for h in self._early.pop(rid, []) if (epoch_of(h) or 0) > e]
        if newer:
            self._early[rid] = newer

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
                f"[RankAgreement] {rid!r}: {who} is at epoch {e}, but {self._me()} at {g.epoch}"
            ]
        inc = inc_of(h) or 0
        if who in self._names() and g.incs.setdefault(who, inc) != inc:
            return [self._restarted(rid, g, who, g.incs[who], inc)]
        if kind == ABORT:
            return reasons_of(h) or [f"{who} aborted"]
        if kind == INSTALLED and type(h.get("rank")) is int and 0 <= h["rank"] < self.dst_tp:
            g.installed.add(h["rank"])
        if kind == OFFER and type(h.get("rank")) is int and 0 <= h["rank"] < self.src_tp:
            g.offered.add(h["rank"])
        return None
