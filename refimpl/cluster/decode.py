"""A decode worker (a cluster may run several) of TP D: D processes, one per decode
rank, each a ``refimpl.api.ranks`` ``RankReceiver`` that installs only its own heads;
a request is ready only once every rank of the worker installed (RankAgreement). Rank 0
(the leader, ``d0``) speaks for the decode worker of the spec (its events, its reports)
and decodes every ready request a token per loop turn, so that a cancel can land
mid-decode; the other ranks (``d0r1``, ...) compute their heads' attention when it asks
(``ends.SplitKV``) and give their blocks back when it says the request is over.

One handoff: the leader's "handoff" (first token, steps, planned cancel) comes just
before its manifest, on the same mailbox; the Receiver is told the decode room
(``expect``; the leader sends it to every rank of the worker), then each rank's
RankReceiver does everything the API does with a peer's KV: the manifest gate and
the reservation (DecodeReserve, and the Ready goes to every prefill rank; no room:
DecodeReject and a Nack), each rank's chunks checked and installed, each rank's seal,
the commit (the deliveries of every chunk and RankDone, DecodeValidate, DecodeCommit,
then the Ack). An attempt not committed within two timeouts of its Ready, or whose
prefill rank died, or that failed a check, or that the sender aborted: DecodeTimeout
(the Receiver gives back its blocks, fences its late chunks and answers a Nack).

A killed decode worker comes back as a new process, a new incarnation with empty pools
(the router starts it); what the old one held is gone with it (the router retries those
requests). A cancel planned at decode step K (the handoff's ``cancel_step``) is the
client's cancel arriving after K tokens, the same in every run of a seed.

Mutant ``cancel_ignored`` (spec/mutants.py): a cancel is recorded (ClientCancel) but
decoding goes on as if it had not come.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from refimpl.api import KVGeometry, State
from refimpl.api.ranks import rank_route, sub_id
from refimpl.cluster.control import Message, load_factor
from refimpl.cluster.ends import (
    LAYOUT,
    RankDead,
    SplitKV,
    await_reply,
    channel_proc,
    decode_end,
    held,
    pack,
    rank_kv,
    room,
    sent_bytes,
    serve_attend,
    unpack,
)
from refimpl.cluster.link import RAW_TAG, Link, is_link_message
from refimpl.cluster.worker import CLOSE_WAIT, Base, WorkerArgs, proc_name
from refimpl.errors import CapacityError
from refimpl.model import PagedKV

if TYPE_CHECKING:
    from refimpl.blocks import BlockAllocator

VOID = 1 << 62  # a fence above every epoch: a finished request's late chunks go


@dataclass
class Pending:
    """A handoff the Receiver is taking (what the leader's "handoff" said)."""

    epoch: int
    first: int
    steps: int
    cancel_step: int | None
    tokens: int  # the prompt's and its decode room: what the attempt reserves
    deadline: float = 0.0  # set at DecodeReserve
    t_ready: float = 0.0


@dataclass
class Running:
    rid: str
    store: Any  # the model's KV store of the request (``ends.SplitKV``)
    tokens: list[int]
    position: int  # position of the next token fed to the model
    steps: int  # decode steps still to run
    cancelled: bool = False
    cancel_step: int | None = None  # the client cancels after this many steps
    done: int = 0  # steps run
    stats: dict[str, float] = field(default_factory=dict)


class DecodeWorker(Base):
    def __init__(self, a: WorkerArgs) -> None:
        super().__init__(a)
        self.model = self.spec.model()
        self.leader = a.drank == 0
        self.link = Link(self.ch, self.pairs, self.route, self.wait)
        self.w, self.rx, self.own = decode_end(
            self.model, self.spec.block_size, a.capacity, self.link,
            tp=a.decode_tp, rank=a.drank, src_tp=a.prefill_tp, inc=a.inc,
        )  # fmt: skip
        p, d = a.prefill_tp, a.decode_tp
        self.ranks = rank_route(range(p), range(p, p + d), self.spec.kv_heads)
        self.pending: dict[str, Pending] = {}
        self.running: dict[str, Running] = {}
        self.stores: dict[str, PagedKV] = {}  # a rank's ready requests (its heads' KV)
        self.store_epoch: dict[str, int] = {}  # their attempts' epochs
        self.siblings = [proc_name("decode", a.rank, j) for j in range(1, d) if self.leader]
        self.seq = 0  # attend requests sent (the leader)
        self.stalled = ""  # a rank did not answer: the router restarts this worker
        self.prefill_down = False
        self.raw_posted: set[int] = set()
        self.raw_sizes: list[list[int]] | None = None

    @property
    def alloc(self) -> BlockAllocator:
        """This decode rank's own pool's allocator (its heads' blocks: ``decode_end``)."""
        return self.own.alloc

    def route(self, channel: str) -> str:
        return channel_proc(self.ranks, self.a.prefill_tp, f"d{self.a.rank}", channel)

    def handle(self, m: Message) -> None:
        if is_link_message(m):
            self.link.deliver(m)
            return
        getattr(self, f"on_{m['kind']}")(m)

    def sid(self, rid: str) -> str:
        return sub_id(rid, self.a.drank)

    # ------------------------------------------------------------------ handoff
    def on_handoff(self, m: Message) -> None:
        rid = m["rid"]
        ended = self.closing is not None or rid in self.running or rid in self.stores
        if self.prefill_down or ended:
            return  # its sender is gone (the router fails it), the run's end, or a duplicate
        if rid in self.pending and not self.rx.state(rid).final:
            self.end(rid, "superseded by a newer attempt")
        self.forget(rid)
        cs, n, steps = m.get("cancel_step"), m.get("tokens"), int(m["steps"])
        p = Pending(int(m["epoch"]), int(m["first"]), steps, None if cs is None else int(cs),
                    n + steps + 1 if type(n) is int else 0)  # fmt: skip
        self.rx.expect(rid, decode_room=p.steps + 1, epoch=p.epoch)  # older attempts' words: void
        self.pending[rid] = p

    def poll_handoffs(self) -> bool:
        """Let the RankReceiver read each handoff's messages; the leader logs what it
        did, then the answers go out."""
        moved = False
        for rid in list(self.pending):
            p, was = self.pending[rid], self.rx.state(rid)
            if was is State.WAITING and not room(self.alloc, p.tokens, self.spec.block_size):
                continue  # its manifest stays unread until a request here gives back room
            moved |= self.rx.poll(rid) > 0
            now = self.rx.state(rid)
            if was is State.WAITING and now is not State.WAITING and now is not State.REFUSED:
                if self.leader:
                    self.event("DecodeReserve", rid, msg="Handoff", epoch=p.epoch, idx=0)
                p.deadline = time.monotonic() + 2 * self.a.timeout_s
                p.t_ready = time.perf_counter()
            if now is State.REFUSED:
                if self.leader and isinstance(self.rx.rx.error(self.sid(rid)), CapacityError):
                    self.event("DecodeReject", rid, msg="Handoff", epoch=p.epoch, idx=0)
                self.forget(rid)
            elif now is State.DONE:
                self.commit(rid, p) if self.leader else self.installed(rid)
            elif now is State.ABORTED:
                if self.leader:
                    self.event("DecodeTimeout", rid)
                self.forget(rid)
            elif now is State.RECEIVING and time.monotonic() > p.deadline:
                self.end(rid, f"not committed within {2 * self.a.timeout_s}s of its ready")
            self.link.flush()  # the answer goes out after the events that explain it
        return moved

    def rank_store(self, rid: str) -> tuple[PagedKV, Any]:
        """This rank's KV of a ready request (its heads, its blocks) and its manifest."""
        m = self.rx.rx.result(self.sid(rid)).manifest
        kv = rank_kv(self.model.cfg, LAYOUT, self.spec.block_size, self.a.decode_tp,
                     self.own.pools[0].kv, self.rx.blocks(rid), m.num_tokens)  # fmt: skip
        return kv, m

    def installed(self, rid: str) -> None:
        """A rank other than the leader: every rank installed; it waits for ``attend``."""
        self.store_epoch[rid] = self.pending.pop(rid).epoch
        self.stores[rid] = self.rank_store(rid)[0]

    def commit(self, rid: str, p: Pending) -> None:
        """Every decode rank committed (the Acks are queued): the events, then decoding."""
        own, m = self.rank_store(rid)
        t = time.perf_counter()
        n = len(m.sent_blocks)
        for r in range(self.a.prefill_tp):
            for j in range(n):
                self.event("DecodeReceiveChunk", rid, msg="Chunk", epoch=m.epoch, idx=r * n + j)
            self.event("DecodeReceiveDone", rid, msg="RankDone", epoch=m.epoch, idx=r)
        self.event("DecodeValidate", rid)
        self.event("DecodeCommit", rid)
        del self.pending[rid]
        if self.a.decode_tp > 1:  # the prefill leader releases after this word (prefill.py)
            self.ch.send("p0", "commit", rid=rid, epoch=m.epoch)
        # Receiving, verifying and committing are one RankReceiver.poll: its start and end.
        stats = {"rankdone": t, "data": t, "verified": t, "commit": time.perf_counter()}
        stats = {k: v - p.t_ready for k, v in stats.items()}
        sub = sent_bytes(KVGeometry.from_manifest_source(m), n)
        stats["bytes"] = float(sub * self.a.decode_tp)  # every decode rank's sub-handoff
        self.report("committed", rid=rid, stats=stats)
        store = SplitKV(self.model.cfg, own, self.a.decode_tp,
                        lambda *x, rid=rid: self.attend(rid, *x))  # fmt: skip
        self.running[rid] = Running(
            rid, store, [p.first], m.num_tokens, p.steps, stats=stats, cancel_step=p.cancel_step,
        )  # fmt: skip

    def end(self, rid: str, why: str) -> None:
        """DecodeTimeout: the RankReceiver aborts (blocks back, every rank told, a Nack)."""
        self.rx.abort(rid, why)
        if self.leader:
            self.event("DecodeTimeout", rid)
        self.forget(rid)

    def forget(self, rid: str) -> None:
        """The attempt ended here (a retry, at the next epoch, is still taken); the
        leader tells the other ranks, whose part of it may have been installed."""
        p = self.pending.pop(rid, None)
        if p is not None:
            for sib in self.siblings:
                self.ch.send(sib, "finish", rid=rid, epoch=p.epoch)
        st = self.rx.state(rid)
        if not st.final and st is not State.WAITING:
            self.rx.abort(rid, "ended by its decode worker")
        self.rx.forget(rid)

    # ------------------------------------------------------------------ decoding
    def step(self) -> bool:
        busy = self.link.retire()
        busy |= self.poll_handoffs()
        if self.stalled:
            return busy
        for r in list(self.running.values()):
            if r.cancel_step is not None and r.done >= r.cancel_step and not r.cancelled:
                self.event("ClientCancel", r.rid)  # the client's cancel, at its planned step
                r.cancelled = True
            if r.cancelled and self.a.mutant != "cancel_ignored":
                self.event("DecodeAbort", r.rid)
                self.finish(r.rid)
                self.report("outcome", rid=r.rid, outcome="cancelled", reason="cancelled on decode")
                continue
            if r.steps > 0:
                try:
                    logits = self.model.decode_step(r.tokens[-1], r.position, r.store)
                except RankDead as e:  # a rank is dead or stuck: the router restarts us all
                    self.stalled = str(e)
                    self.report("stalled", reason=self.stalled)
                    print(f"{self.a.log_name} stalled: {self.stalled}", file=sys.stderr, flush=True)
                    return True
                r.tokens.append(int(logits.argmax()))
                r.position += 1
                r.steps -= 1
                r.done += 1
                self.event("DecodeStep", r.rid)
                continue
            self.event("DecodeFinish", r.rid)
            self.finish(r.rid)
            self.report("outcome", rid=r.rid, outcome="finished", tokens=r.tokens, stats=r.stats)
        return busy or bool(self.running)

    def attend(self, rid: str, rank: int, layer: int, start: int, *qkv: Any) -> Any:
        """Decode rank ``rank``'s attention of its heads (``ends.serve_attend``), in its process."""
        self.seq += 1
        to = self.siblings[rank - 1]
        q, k, v = (pack(t) for t in qkv)
        self.ch.send(to, "attend", rid=rid, seq=self.seq, layer=layer, start=start, q=q, k=k, v=v)
        patience = self.a.timeout_s * load_factor()  # a loaded machine's rank is late
        got = await_reply(lambda: self.ch.poll([to]), self.backlog.append, self.seq, patience)
        if not got.get("ok"):
            raise RankDead(f"{to}: {str(got.get('reason'))[:200]}")
        return unpack(got.get("y"), self.model.cfg.torch_dtype, 3)

    def on_attended(self, m: Message) -> None:
        """A late answer to an ``attend`` given up on (this worker is being restarted)."""

    def on_attend(self, m: Message) -> None:
        """A rank other than the leader: its heads' attention, for the leader."""
        rid, seq = m.get("rid"), m.get("seq")
        deadline = time.monotonic() + self.a.timeout_s * load_factor()
        while rid in self.pending and time.monotonic() < deadline:
            self.poll_handoffs()  # what makes it ready here may still be on its way
            for x in self.ch.poll() if rid in self.pending else ():
                (self.backlog.append if x.get("kind") == "attend" else self.handle)(x)
        store = self.stores.get(rid) if isinstance(rid, str) else None
        try:
            if store is None:
                raise ValueError(f"{rid!r:.40} is not ready on {self.a.name}")
            y = serve_attend(self.model.cfg, store, self.a.decode_tp, self.a.drank, m)
        except ValueError as e:
            self.ch.send(m["src"], "attended", seq=seq, ok=False, reason=str(e))
            return
        self.ch.send(m["src"], "attended", seq=seq, ok=True, y=pack(y))

    def finish(self, rid: str) -> None:
        """The request is over here: its blocks, its record and its late messages go
        (on every rank of the worker: the leader tells them)."""
        self.alloc.free(self.sid(rid))
        self.running.pop(rid, None)
        self.stores.pop(rid, None)
        self.store_epoch.pop(rid, None)
        self.forget(rid)
        for inbox in self.rx.inboxes(rid):
            self.link.fence(inbox, VOID)
        for sib in self.siblings:
            self.ch.send(sib, "finish", rid=rid)

    def on_finish(self, m: Message) -> None:
        """The leader ended the request (every attempt up to ``epoch``): this rank's
        part goes too, installed or not."""
        rid, e = str(m.get("rid")), m.get("epoch", VOID)
        e = e if type(e) is int else VOID
        self.poll_handoffs()  # an attempt installed here becomes a store first
        p = self.pending.get(rid)
        if p is not None and p.epoch <= e:
            self.end(rid, "ended by the decode leader")
        if rid in self.stores and self.store_epoch.get(rid, 0) <= e:
            self.finish(rid)
        self.link.flush()

    def on_cancel(self, m: Message) -> None:
        r = self.running.get(m["rid"])
        if r is not None and not r.cancelled:
            self.event("ClientCancel", r.rid)
            r.cancelled = True

    # ------------------------------------------------------------------ the router
    def on_shutdown(self, m: Message) -> None:
        """The run is over (its deadline too): a decoding request is cancelled, a reserved
        one times out, one not reserved is dropped; the bye waits (``settled``, bounded)
        for their blocks (issue #34: decode said bye holding its decoding requests')."""
        self.poll_handoffs()
        for r in list(self.running.values()):
            if not r.cancelled:
                self.event("ClientCancel", r.rid)
            self.event("DecodeAbort", r.rid)
            self.finish(r.rid)
        for rid in list(self.pending):
            self.forget(rid) if self.rx.state(rid) is State.WAITING else self.end(rid, "run ended")
        for rid in list(self.stores):
            self.finish(rid)
        self.link.flush()
        self.begin_close(CLOSE_WAIT if self.leader else 1)

    def settled(self) -> bool:
        return not self.pending and not self.running and held(self.alloc) == 0

    def on_dead(self, m: Message) -> None:
        self.learned(m)
        self.dead.add(m["who"])
        if m["who"].startswith("p"):
            for rid in list(self.pending):  # its attempts cannot complete
                if self.rx.state(rid) is State.RECEIVING:
                    self.end(rid, f"prefill rank {m['who']} died")
                else:
                    self.forget(rid)
            self.link.flush()
            self.prefill_down = True
            self.report("settled", lc=self.log.lc)

    def on_restarted(self, m: Message) -> None:
        super().on_restarted(m)
        if any(str(w).startswith("p") for w in m["who"]):
            self.prefill_down = False

    def on_status(self, m: Message) -> None:
        self.report("status", open=sorted(self.running))

    def on_raw(self, m: Message) -> None:
        self.raw_sizes = [list(map(int, s)) for s in m["sizes"]]
        self.try_raw()

    def on_raw_posted(self, m: Message) -> None:
        self.raw_posted.add(int(m["rank"]))
        self.try_raw()

    def try_raw(self) -> None:
        """Raw send/recv of the handoffs' bytes, same ranks, same order, timed here."""
        if self.raw_sizes is None or len(self.raw_posted) < self.a.prefill_tp:
            return
        total, seconds = 0, 0.0
        for i, sizes in enumerate(self.raw_sizes):
            bufs = [torch.empty(n, dtype=torch.uint8) for n in sizes]
            t = time.perf_counter()
            works = [self.pairs.irecv(f"p{r}", b, RAW_TAG + i) for r, b in enumerate(bufs)]
            if not all(w is not None and self.wait(w) for w in works):
                self.report("raw_done", ok=False, bytes=total, seconds=seconds)
                return
            seconds += time.perf_counter() - t
            total += sum(sizes)
        self.raw_sizes = None
        self.report("raw_done", ok=True, bytes=total, seconds=seconds)
