"""``RankSender``: one prefill TP rank in its own process, offering each decode rank
only its slice of that rank's heads, at the epoch ``Epochs`` chose for the group
(``refimpl.api.ranks.group`` says how the ranks agree)."""

from __future__ import annotations

from collections.abc import Sequence

from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.api.ranks.group import (
    OFFER,
    Epochs,
    _Group,
    _Member,
    _pieces,
    group_channel,
    sub_id,
)
from refimpl.api.sender import Sender
from refimpl.api.switches import (
    HEADS_OF_ANOTHER_RANK,
    RANK_SENDER_SWITCHES,
    SLICE_READ_AT_READY,
    STREAM_READS_AT_READY,
    check_switches,
)
from refimpl.api.wire import ABORT, State, channels
from refimpl.memory.registered import head_slice
from refimpl.rankpools import RankPools
from refimpl.transport import Transport

__all__ = ["RankSender"]


class RankSender(_Member):
    """One prefill TP rank (its own process): its slice of each decode rank's heads."""

    def __init__(
        self,
        pools: RankPools,
        geometry: KVGeometry,
        transport: Transport,
        model: ModelIdentity,
        *,
        rank: int,
        dst_tp: int,
        epochs: Epochs,
        incarnation: int = 0,
        mutants: frozenset[str] = frozenset(),
        blocks_per_chunk: int | None = None,
    ) -> None:
        """``geometry``: the prefill side's (tp = P), ``pools`` rank ``rank``'s alone
        (``geometry.make_rank_pools``); ``dst_tp``: the decode side's TP.
        ``incarnation``: this process's restarts so far (a restarted rank builds a new
        RankSender with the next one): its group messages carry it, and an attempt its
        older incarnation offered is never offered again (``Epochs.claim``). The
        sub-handoffs' Senders carry it too: a decode rank fences each prefill rank it
        hears by that rank's own incarnation (``ranks.fence``).
        ``mutants``: bug switches (``refimpl.api.switches``), for demonstrations only.
        ``blocks_per_chunk``: the sub-handoffs' Senders' (their default if None)."""
        geometry.check_rank_pools(pools, rank)
        self.mutants = check_switches(mutants, RANK_SENDER_SWITCHES, "RankSender")
        self._init_member(incarnation)
        self.pools, self.geometry, self.transport, self.epochs = pools, geometry, transport, epochs
        self.rank, self.src_tp, self.dst_tp, self.side = rank, geometry.tp, dst_tp, "p"
        own = geometry.kv_heads_per_rank
        self._subs: dict[int, tuple[Sender, int, RankPools | None]] = {}  # d -> (tx, lo, pool)
        for d in range(dst_tp):
            pieces = _pieces(geometry.kv_heads, geometry.tp, dst_tp, d)
            mine = [i for i, p in enumerate(pieces) if p.src_rank == rank]
            if not mine:
                continue
            p = pieces[mine[0]]
            sub_geo = geometry.with_(kv_heads=sum(q.src_stop - q.src_start for q in pieces),
                                     tp=len(pieces))  # fmt: skip
            lo, n = p.src_start, p.src_stop - p.src_start
            if HEADS_OF_ANOTHER_RANK in self.mutants:  # the bug: the neighbour's slice
                lo = (lo + n) % own
            sub_pools = None  # a narrower decode rank: a view of its heads, no copy
            if n != own:
                want = sub_geo.rank_view(mine[0]).rank_pool_geometry()
                sub_pools = head_slice(pools, want, lo)
            lazy = SLICE_READ_AT_READY in self.mutants and sub_pools is not None  # the bug
            tx = Sender(sub_pools or pools, sub_geo, transport, model, rank=mine[0],
                        blocks_per_chunk=blocks_per_chunk, incarnation=incarnation,
                        mutants=frozenset({STREAM_READS_AT_READY} if lazy else ()))  # fmt: skip
            self._subs[d] = (tx, lo, sub_pools)
        self._g: dict[str, _Group] = {}
        self._blocks: dict[str, list[int]] = {}

    def peer_restarted(self, side: str, rank: int, incarnation: int) -> None:
        """As ``_Member.peer_restarted``; a decode rank's restart reaches the sub-handoff
        sending to it too (``Sender.peer_restarted``): a ready, ack or nack of its dead
        incarnation is refused there by name and changes nothing."""
        super().peer_restarted(side, rank, incarnation)
        if side == "d" and rank in self._subs:
            self._subs[rank][0].peer_restarted(incarnation)

    def stale(self) -> list[str]:
        """The group's and the sub-handoffs' messages refused as a dead incarnation's."""
        return [*super().stale(), *(s for tx, _, _ in self._subs.values() for s in tx.stale())]

    def state(self, request_id: str) -> State:
        return self._g[request_id].state

    def reasons(self, request_id: str) -> list[str]:
        return list(self._g[request_id].reasons)

    def answered(self, request_id: str) -> bool:
        """A decode rank this rank sends to answered its offer with Ready (its
        sub-handoff went on to send): what an engine's leader waits for before it lets
        the other prefill ranks offer."""
        for d, (tx, _, _) in self._subs.items():
            try:
                st = tx.state(sub_id(request_id, d))
            except KeyError:
                continue  # not offered here (yet)
            if st in (State.SENDING, State.DONE):  # DONE: acked, so Ready came first
                return True
        return False

    def inboxes(self, request_id: str) -> list[str]:
        """The channels this rank reads for the request (its group channel, its
        sub-handoffs' replies): what a transport fences once the request is over."""
        subs = [channels(sub_id(request_id, d)).to_rank(tx.rank or 0)
                for d, (tx, _, _) in self._subs.items()]  # fmt: skip
        return [group_channel(request_id, "p", self.rank), *subs]

    def stats(self, request_id: str) -> dict[int, tuple[int, int]]:
        """Per decode rank this rank sends to: (chunks, payload bytes) of the attempt
        ((0, 0) where nothing was offered: the attempt ended here before the offer)."""
        out = {}
        for d, (tx, _, _) in self._subs.items():
            try:
                out[d] = tx.stats(sub_id(request_id, d))
            except KeyError:
                out[d] = (0, 0)
        return out

    def held(self) -> dict[str, tuple[int, ...]]:
        """Blocks this rank's sub-handoffs hold (a streamed offer pins nothing: each
        ``send_layer`` copies its layer, of the request's blocks or a view of a slice
        of their heads, at once)."""
        return {sid: b for tx, _, _ in self._subs.values() for sid, b in tx.held().items()}

    def offer(
        self,
        request_id: str,
        token_ids: Sequence[int],
        *,
        blocks: Sequence[int],
        prefix_blocks: int = 0,
    ) -> int:
        """Offer the request's current attempt (``Epochs.current``), layer by layer;
        returns its epoch. ``blocks``: the request's blocks holding ``token_ids``.
        An attempt that has already ended here (an abort heard or made before this
        offer, or one this rank's older incarnation offered) is not offered: its state
        is ABORTED with the reasons, told to every rank."""
        g = self._g.get(request_id)
        if g is not None and not g.state.final:
            raise ValueError(f"{request_id!r} already has an attempt in state {g.state.value}")
        e = self.epochs.current(request_id)
        if g is not None and g.epoch == e and g.state is not State.DONE:
            return e  # this attempt ended here before the offer: nothing leaves
        g = self._g[request_id] = _Group(e, State.OFFERED)
        if (was := self.epochs.claim(request_id, self.rank, e, self.incarnation)) is not None:
            why = self._restarted(request_id, g, self._me(), was, self.incarnation)
            self._end_group(request_id, g, [f"{why}; the router opens a retry"], tell=True)
            return e
        self._blocks[request_id] = list(blocks)
        try:
            self._offer_subs(request_id, token_ids, e, prefix_blocks)
        except Exception as exc:  # a half-made offer: every rank ends it with the reason
            self._stop(
                request_id, g, [f"{self._me()}'s offer at epoch {e} failed: {exc}"], tell=True
            )
            raise
        self._say(request_id, {"type": OFFER, "epoch": e, "rank": self.rank})
        return e

    def _offer_subs(self, rid: str, token_ids: Sequence[int], e: int, prefix_blocks: int) -> None:
        for d, (tx, _, sp) in self._subs.items():
            sid = sub_id(rid, d)
            tx.forget(sid)
            use = self._hold(rid, d, sp)
            try:
                tx.offer(sid, token_ids, blocks=use, epoch=e, dst_tp=1,
                         prefix_blocks=prefix_blocks, layers=self.geometry.num_layers)  # fmt: skip
            finally:
                self.pools.alloc.free(sid)

    def _hold(self, rid: str, d: int, sp: RankPools | None) -> list[int]:
        """The blocks sub-handoff d reads: the request's own, through ``sp``'s view of
        their heads where it sends a slice (a reference for the call: the Sender checks
        its holder in the one block table)."""
        sid, blocks = sub_id(rid, d), self._blocks[rid]
        if sp is not None:
            sp.alloc = sp.pools[0].allocator = self.pools.alloc  # the table, even if renewed
        self.pools.alloc.incref(sid, blocks)
        return blocks

    def send_layer(self, request_id: str, layer: int) -> None:
        """Layer ``layer`` is written in the request's blocks here: send each decode
        rank its slice of it (copied now: the blocks may be reused after this returns)."""
        g = self._g[request_id]
        if g.state.final:
            return
        for d, (tx, _, sp) in self._subs.items():
            sid = sub_id(request_id, d)
            self._hold(request_id, d, sp)
            try:
                tx.send_layer(sid, layer)  # copies the layer (of its heads: sp's view) now
            finally:
                self.pools.alloc.free(sid)
        if g.state is State.OFFERED:
            g.state = State.SENDING

    def poll(self, request_id: str) -> int:
        """The sub-handoffs' replies and the group's messages; returns messages read.
        Before this rank's offer, an abort heard ends the attempt here already."""
        g = self._g.get(request_id)
        n = 0
        for d, (tx, _, _) in self._subs.items():
            n += tx.poll(sub_id(request_id, d))
        heard = self._heard(request_id)
        if g is None:
            self._before(request_id, heard, self.epochs.peek(request_id))
            return n + len(heard)
        if g.state.final:
            return n + len(heard)
        heard = self._early_then(request_id, heard)
        for h in heard:
            if (why := self._hear(request_id, g, h)) is not None:
                self._stop(request_id, g, why, tell=h.get("type") != ABORT)
                return n + len(heard)
        if g.lost:
            self._stop(request_id, g, g.lost, tell=True)
            return n + len(heard)
        for d, (tx, _, _) in self._subs.items():
            st = tx.state(sub_id(request_id, d))
            if st.final and st is not State.DONE:
                why = [f"prefill rank {self.rank} to decode rank {d}: {r}"
                       for r in tx.reasons(sub_id(request_id, d))]  # fmt: skip
                self._stop(request_id, g, why or [f"sub-handoff {st.value}"], tell=True)
                return n + len(heard)
        if why_gone := self._failed(request_id):
            self._stop(request_id, g, [why_gone], tell=True)
        elif len(g.installed) == self.dst_tp and all(
            tx.state(sub_id(request_id, d)) is State.DONE for d, (tx, _, _) in self._subs.items()
        ):
            self._done(request_id, g)
        return n + len(heard)

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """End the attempt on this rank and tell every rank of both sides why (before
        this rank's offer too: the newest attempt ends on every rank). The reason names
        the epoch and what the attempt still waited for (``waiting``)."""
        g = self._g.get(request_id)
        if g is not None and not g.state.final:
            self._stop(request_id, g, [self._aborted(request_id, reason)], tell=True)
        elif g is None:
            e = self.epochs.peek(request_id)
            g = self._g[request_id] = _Group(e, State.OFFERED)
            self._end_group(request_id, g, [self._aborted(request_id, reason)], tell=e > 0)

    def _stop(self, rid: str, g: _Group, reasons: list[str], *, tell: bool) -> None:
        for d, (tx, _, _) in self._subs.items():
            tx.abort(sub_id(rid, d), reasons[0] if reasons else "aborted")
        self._end_group(rid, g, reasons, tell)

    def crash(self) -> None:
        """Lose everything (this rank's process crashed, as ``Sender.crash``): attempts
        forgotten, the rank's pools and its sub-handoffs' copies reset. The ranks left
        hear it from the engine (``abort`` with the reason) or the transport
        (``failed``)."""
        for tx, _, sp in self._subs.values():
            tx.crash()
            if sp is not None:
                sp.reset()
        self.pools.reset()
        for d in (self._g, self._blocks, self._early):
            d.clear()

    def forget(self, request_id: str) -> None:
        """Drop an ended attempt's records here (its sub-handoffs' too)."""
        g = self._g.get(request_id)
        if g is not None and not g.state.final:
            raise ValueError(f"{request_id!r} is still {g.state.value}; abort it first")
        for d, (tx, _, _) in self._subs.items():
            tx.forget(sub_id(request_id, d))
        self._drop(request_id)
        self._g.pop(request_id, None)
        self._blocks.pop(request_id, None)
        self.epochs.release(request_id, self.rank)
