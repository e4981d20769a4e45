"""A decode worker (TP=1; a cluster may run several): one ``refimpl.api`` ``Receiver``
takes every handoff, and every committed request decodes a token per loop turn, so that
a cancel can land mid-decode.

One handoff: the leader's "handoff" (first token, steps, planned cancel) comes just
before its manifest, on the same mailbox; the Receiver is told the decode room
(``expect``), then does everything the API does with a peer's KV: the manifest gate and
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

import time
from dataclasses import dataclass, field

import torch

from refimpl.api import KVGeometry, State, channels
from refimpl.cluster.control import Message
from refimpl.cluster.ends import decode_end, sent_bytes
from refimpl.cluster.link import RAW_TAG, Link, is_link_message
from refimpl.cluster.worker import Base, WorkerArgs
from refimpl.errors import CapacityError
from refimpl.model import PagedKV

VOID = 1 << 62  # a fence above every epoch: a finished request's late chunks go


@dataclass
class Pending:
    """A handoff the Receiver is taking (what the leader's "handoff" said)."""

    epoch: int
    first: int
    steps: int
    cancel_step: int | None
    deadline: float = 0.0  # set at DecodeReserve
    t_ready: float = 0.0


@dataclass
class Running:
    rid: str
    store: PagedKV
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
        self.link = Link(self.ch, self.pairs, self.route, self.wait)
        self.w, self.rx = decode_end(self.model, self.spec.block_size, a.capacity, self.link)
        self.pending: dict[str, Pending] = {}
        self.running: dict[str, Running] = {}
        self.prefill_down = False
        self.raw_posted: set[int] = set()
        self.raw_sizes: list[list[int]] | None = None

    def route(self, channel: str) -> str:
        """An API channel's process: replies go to source rank r (``>tx{r}``)."""
        head, sep, tail = channel.rpartition(">tx")
        if not sep or not (tail == "" or tail.isdigit()) or int(tail or 0) >= self.a.prefill_tp:
            raise ValueError(f"channel {channel!r} routes to no prefill rank of this cluster")
        return f"p{int(tail or 0)}"

    def handle(self, m: Message) -> None:
        if is_link_message(m):
            self.link.deliver(m)
            return
        getattr(self, f"on_{m['kind']}")(m)

    # ------------------------------------------------------------------ handoff
    def on_handoff(self, m: Message) -> None:
        rid = m["rid"]
        if self.prefill_down or rid in self.running:
            return  # its sender is gone (the router fails the request), or a duplicate
        if rid in self.pending and not self.rx.state(rid).final:
            self.end(rid, "superseded by a newer attempt")
        self.rx.forget(rid)
        cs = m.get("cancel_step")
        p = Pending(
            int(m["epoch"]), int(m["first"]), int(m["steps"]), None if cs is None else int(cs)
        )
        self.rx.expect(rid, decode_room=p.steps + 1)
        self.pending[rid] = p

    def poll_handoffs(self) -> bool:
        """Let the Receiver read each handoff's messages; log what it did, then answer."""
        moved = False
        for rid in list(self.pending):
            p, was = self.pending[rid], self.rx.state(rid)
            moved |= self.rx.poll(rid) > 0
            now = self.rx.state(rid)
            if was is State.WAITING and now is not State.WAITING and now is not State.REFUSED:
                self.event("DecodeReserve", rid, msg="Handoff", epoch=p.epoch, idx=0)
                p.deadline = time.monotonic() + 2 * self.a.timeout_s
                p.t_ready = time.perf_counter()
            if now is State.REFUSED:
                if isinstance(self.rx.error(rid), CapacityError):
                    self.event("DecodeReject", rid, msg="Handoff", epoch=p.epoch, idx=0)
                self.forget(rid)
            elif now is State.DONE:
                self.commit(rid, p)
            elif now is State.ABORTED:
                self.event("DecodeTimeout", rid)
                self.forget(rid)
            elif now is State.RECEIVING and time.monotonic() > p.deadline:
                self.end(rid, f"not committed within {2 * self.a.timeout_s}s of its ready")
            self.link.flush()  # the answer goes out after the events that explain it
        return moved

    def commit(self, rid: str, p: Pending) -> None:
        """The Receiver committed (its Ack is queued): the events, then decoding."""
        got = self.rx.result(rid)
        m, t = got.manifest, time.perf_counter()
        n = len(m.sent_blocks)
        for r in range(m.src_tp):
            for j in range(n):
                self.event("DecodeReceiveChunk", rid, msg="Chunk", epoch=m.epoch, idx=r * n + j)
            self.event("DecodeReceiveDone", rid, msg="RankDone", epoch=m.epoch, idx=r)
        self.event("DecodeValidate", rid)
        self.event("DecodeCommit", rid)
        del self.pending[rid]
        # Receiving, verifying and committing are one Receiver.poll: its start and end.
        stats = {"rankdone": t, "data": t, "verified": t, "commit": time.perf_counter()}
        stats = {k: v - p.t_ready for k, v in stats.items()}
        stats["bytes"] = float(sent_bytes(KVGeometry.from_manifest_source(m), n))
        self.report("committed", rid=rid, stats=stats)
        self.running[rid] = Running(
            rid, self.w.store(got.blocks, m.num_tokens), [p.first], m.num_tokens, p.steps,
            stats=stats, cancel_step=p.cancel_step,
        )  # fmt: skip

    def end(self, rid: str, why: str) -> None:
        """DecodeTimeout: the Receiver aborts (blocks back, late chunks fenced, a Nack)."""
        self.rx.abort(rid, why)
        self.event("DecodeTimeout", rid)
        self.forget(rid)

    def forget(self, rid: str) -> None:
        """The attempt ended here (a retry, at the next epoch, is still taken)."""
        self.pending.pop(rid, None)
        self.rx.forget(rid)

    # ------------------------------------------------------------------ decoding
    def step(self) -> bool:
        busy = self.link.retire()
        busy |= self.poll_handoffs()
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
                logits = self.model.decode_step(r.tokens[-1], r.position, r.store)
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

    def finish(self, rid: str) -> None:
        """The request is over here: its blocks, its record and its late messages go."""
        self.alloc.free(rid)
        del self.running[rid]
        self.forget(rid)
        self.link.fence(channels(rid).to_receiver, VOID)

    def on_cancel(self, m: Message) -> None:
        r = self.running.get(m["rid"])
        if r is not None and not r.cancelled:
            self.event("ClientCancel", r.rid)
            r.cancelled = True

    # ------------------------------------------------------------------ the router
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

    def on_shutdown(self, m: Message) -> None:
        self.begin_close(0)  # decode's own timeouts end what it holds: its bye is at once
