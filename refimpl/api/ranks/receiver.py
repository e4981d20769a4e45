"""``RankReceiver``: one decode TP rank in its own process, a ``Receiver`` of its own
heads; its request is ready only once every decode rank installed its part
(``refimpl.api.ranks.group`` says how the ranks agree)."""

from __future__ import annotations

from typing import Any

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.ranks.fence import PieceIncarnations
from refimpl.api.ranks.group import (
    INSTALLED,
    Epochs,
    _Group,
    _Member,
    _pieces,
    group_channel,
    sub_id,
)
from refimpl.api.receiver import Receiver
from refimpl.api.switches import (
    RANK_ACCEPTS_DEAD_INCARNATION,
    RANK_RECEIVER_SWITCHES,
    READY_ON_OWN_INSTALL,
    check_switches,
)
from refimpl.api.wire import ABORT, State, channels, epoch_of
from refimpl.rankpools import RankPools
from refimpl.transport import Transport

__all__ = ["RankReceiver"]


def _epoch(rx: Receiver, sid: str) -> int | None:
    a = rx._att.get(sid)  # the attempt's epoch (read only, as refimpl.api.abstract does)
    return a.m.epoch if a is not None else None


class RankReceiver(_Member):
    """One decode TP rank (its own process): a ``Receiver`` of its heads, and the group."""

    def __init__(
        self,
        pools: RankPools,
        geometry: KVGeometry,
        transport: Transport,
        model: ModelIdentity,
        *,
        rank: int,
        src_tp: int,
        incarnation: int = 0,
        epochs: Epochs | None = None,
        mutants: frozenset[str] = frozenset(),
        **receiver_options: Any,
    ) -> None:
        """``geometry``: the decode side's (tp = D), ``pools`` rank ``rank``'s alone;
        ``src_tp``: the prefill side's TP. ``incarnation``: this process's restarts so
        far (its Receiver's too: a write to a dead incarnation's registration is
        refused); its sub-handoff fences each prefill rank it hears by that rank's own
        incarnation (``ranks.fence``: a manifest, seal or abort of a dead one is refused
        by name, ``stale``). ``epochs``: the router's, if this rank can reach it: an abort before
        the attempt reached this rank then ends the newest attempt on every rank at once
        (without it, the attempt's manifest is refused here and the prefill ranks tell
        every rank). ``mutants``: this rank's bug switches (``refimpl.api.switches``),
        for demonstrations only. ``receiver_options`` go to the Receiver."""
        geometry.check_rank_pools(pools, rank)
        self.mutants = check_switches(mutants, RANK_RECEIVER_SWITCHES, "RankReceiver")
        self._init_member(incarnation)
        view = geometry.rank_view(rank)
        self.rx = Receiver(pools, view, transport, model, incarnation=incarnation,
                           **receiver_options)  # fmt: skip
        srcs = [p.src_rank for p in _pieces(geometry.kv_heads, src_tp, geometry.tp, rank)]
        dead_ok = RANK_ACCEPTS_DEAD_INCARNATION in self.mutants or self.rx.inc.accept_stale
        self.rx.inc = PieceIncarnations(incarnation, "RankReceiver", srcs, dead_ok)
        self.pools, self.transport, self.epochs = pools, transport, epochs
        self.rank, self.src_tp, self.dst_tp, self.side = rank, src_tp, geometry.tp, "d"
        self._g: dict[str, _Group] = {}
        self._expected: dict[str, int] = {}  # the attempt ``expect`` named, per request

    def expect(self, request_id: str, *, epoch: int | None = None, **kw: Any) -> None:
        """As ``Receiver.expect`` (decode room, this rank's prefix blocks and tokens).
        ``epoch``: the attempt this rank takes, where the engine knows it (its scheduler's
        word of the attempt names it): a group message of an older attempt heard before
        this rank's part arrives is void here (another rank's abort of the attempt
        before, slower than the retry's word, no longer ends the retry)."""
        if epoch is not None and (type(epoch) is not int or epoch < 1):
            raise ValueError(f"{request_id!r}: epoch={epoch!r} must be an int >= 1")
        self.rx.expect(sub_id(request_id, self.rank), **kw)
        if epoch is not None:
            self._expected[request_id] = epoch

    def peer_restarted(self, side: str, rank: int, incarnation: int) -> None:
        """As ``_Member.peer_restarted``; a prefill rank's restart reaches this rank's
        sub-handoff too: from now on that rank's older incarnation's manifest, seal or
        abort is refused there by name (``stale``) and changes nothing."""
        super().peer_restarted(side, rank, incarnation)
        if side == "p":
            self.rx.inc.restarted_rank(rank, incarnation)  # type: ignore[attr-defined]

    def stale(self) -> list[str]:
        """The group's and the sub-handoff's messages refused as a dead incarnation's."""
        return [*super().stale(), *self.rx.stale()]

    def state(self, request_id: str) -> State:
        """DONE only once every decode rank installed (``ready``); else the sub-handoff's
        state, or ABORTED with the group's reasons."""
        g = self._g.get(request_id)
        if g is not None and g.state.final:
            return g.state
        st = self.rx.state(sub_id(request_id, self.rank))
        return State.RECEIVING if st is State.DONE else st

    def ready(self, request_id: str) -> bool:
        """The request may run: every decode rank committed its heads."""
        g = self._g.get(request_id)
        return g is not None and g.state is State.DONE

    def layer_ready(self, request_id: str, layer: int) -> bool:
        """This rank's heads of ``layer`` are in its blocks (``Receiver.layer_ready``:
        landed, not yet committed; the request may run only once ``ready``)."""
        return self.rx.layer_ready(sub_id(request_id, self.rank), layer)

    def reasons(self, request_id: str) -> list[str]:
        g = self._g.get(request_id)
        return list(g.reasons) if g is not None else []

    def blocks(self, request_id: str) -> tuple[int, ...]:
        """This rank's blocks of a ready request (held as ``sub_id(rid, rank)``)."""
        if not self.ready(request_id):
            raise ValueError(f"{request_id!r} is not ready here ({self.state(request_id).value})")
        return self.rx.result(sub_id(request_id, self.rank)).blocks

    def held(self) -> dict[str, tuple[int, ...]]:
        return self.rx.held()

    def inboxes(self, request_id: str) -> list[str]:
        """The channels this rank reads for the request (its group channel, its
        sub-handoff's): what a transport fences once the request is over."""
        sid = sub_id(request_id, self.rank)
        return [group_channel(request_id, "d", self.rank), channels(sid).to_receiver]

    def poll(self, request_id: str) -> int:
        """The sub-handoff's messages and the group's; returns the messages read."""
        sid = sub_id(request_id, self.rank)
        n = self.rx.poll(sid)
        g, e = self._g.get(request_id), _epoch(self.rx, sid)
        if g is not None and g.state.final and (e is None or e <= g.epoch):
            if not self.rx.state(sid).final:  # the group ended before this rank's manifest
                self.rx.abort(sid, g.reasons[0] if g.reasons else "aborted")
            return n
        heard = self._heard(request_id)
        if e is None:  # no attempt here yet: an abort or a failed peer ends it now
            floor = self._expected.get(request_id, 0)  # older attempts' messages are void
            heard = [h for h in heard if (epoch_of(h) or 0) >= floor]
            self._before(request_id, heard, max(floor, self._now(request_id)))
            return n + len(heard)
        if g is None or g.epoch < e:
            g = self._g[request_id] = _Group(e, State.RECEIVING)
            heard = self._early_then(request_id, heard)
        for h in heard:
            if (why := self._hear(request_id, g, h)) is not None:
                self._stop(request_id, g, why, tell=h.get("type") != ABORT)
                return n + len(heard)
        if g.lost:
            self._stop(request_id, g, g.lost, tell=True)
            return n + len(heard)
        st = self.rx.state(sid)
        if st.final and st is not State.DONE:
            self._stop(request_id, g, [f"decode rank {self.rank}: {self.rx.error(sid)}"], tell=True)
        elif why_gone := self._failed(request_id):
            self._stop(request_id, g, [why_gone], tell=True)
        elif st is State.DONE and not g.told:
            g.told = True
            g.installed.add(self.rank)
            self._say(request_id, {"type": INSTALLED, "epoch": g.epoch, "rank": self.rank})
        if g.state is State.RECEIVING and self._all_installed(g):
            self._done(request_id, g)
        return n + len(heard)

    def _all_installed(self, g: _Group) -> bool:
        if READY_ON_OWN_INSTALL in self.mutants:  # the bug: this rank's install is enough
            return self.rank in g.installed
        return len(g.installed) == self.dst_tp

    def end(self, request_id: str, reason: str = "cancelled") -> None:
        """The scheduler has ended the request (``Receiver.end``): this rank's part is
        never committed from now on, and its manifest is refused at intake."""
        self.rx.end(sub_id(request_id, self.rank), reason)

    def fail(self, request_id: str, reason: str) -> None:
        """The engine's own failure of this rank's part (its load failed,
        ``Receiver.fail``): given back here, the prefill ranks nacked with the reason,
        and every rank of both sides told at once; nothing if the attempt is final."""
        g, sid = self._g.get(request_id), sub_id(request_id, self.rank)
        self.rx.fail(sid, reason)
        if g is not None and not g.state.final and self.rx.state(sid).final:
            self._stop(request_id, g, [f"decode rank {self.rank}: {self.rx.error(sid)}"], tell=True)

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """End the attempt on this rank (its blocks given back) and tell every rank; the
        reason names the epoch and what the attempt still waited for (``waiting``).
        Before the attempt reached this rank, its manifest is refused when it comes (the
        prefill ranks end with the reason and tell every rank), and with ``epochs`` the
        newest attempt ends on every rank now."""
        g, sid = self._g.get(request_id), sub_id(request_id, self.rank)
        if g is not None and not g.state.final:
            self._stop(request_id, g, [self._aborted(request_id, reason)], tell=True)
        elif g is None and self.rx.state(sid) is State.WAITING:
            why = self._aborted(request_id, reason)
            self.rx.end(sid, why)
            e = self._now(request_id)
            g = self._g[request_id] = _Group(e, State.RECEIVING)
            self._end_group(request_id, g, [why], tell=e > 0)
        elif g is None:
            self.rx.abort(sid, reason)

    def _now(self, rid: str) -> int:
        """The newest attempt's epoch, if this rank can read it (else 0: unknown)."""
        return self.epochs.peek(rid) if self.epochs is not None else 0

    def _stop(self, rid: str, g: _Group, reasons: list[str], *, tell: bool) -> None:
        sid = sub_id(rid, self.rank)
        if self.rx.state(sid) is State.DONE:
            self.pools.alloc.free(sid)  # committed, but another rank did not: give it back
        else:
            self.rx.abort(sid, reasons[0] if reasons else "aborted")
        self._end_group(rid, g, reasons, tell)

    def crash(self) -> None:
        """Lose everything (this rank's process crashed, as ``Receiver.crash``): attempts
        forgotten, the rank's pools reset."""
        self.rx.crash()
        self._g.clear()
        self._early.clear()
        self._expected.clear()

    def forget(self, request_id: str) -> None:
        """Drop an ended attempt's records here (the Receiver's too)."""
        g = self._g.get(request_id)
        if g is not None and not g.state.final:
            raise ValueError(f"{request_id!r} is still {g.state.value}; abort it first")
        self.rx.forget(sub_id(request_id, self.rank))
        self._drop(request_id, self._expected.pop(request_id, 0))
        self._g.pop(request_id, None)
