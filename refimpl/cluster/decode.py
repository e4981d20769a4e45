"""A decode worker (TP=1; a cluster may run several): receives handoffs one at a time,
then decodes every committed request a token per loop turn, so that a cancel can land
mid-decode.

One handoff (``receive``), after the manifest is accepted and the blocks reserved
(DecodeReserve): send Ready, then wait, within the timeout, for every rank's RankDone;
each one posts that rank's ``irecv`` (its send is already posted) into a private
buffer, never a pool block. A timed-out gloo wait closes its pair for good, so no
receive is posted before its sender has committed to send. Then each rank's bytes are
checked block by block against its RankDone, the ranks' checksums against the manifest
(DecodeReceiveChunk/Done, DecodeValidate), staged, resharded into the target blocks and
committed (DecodeCommit), and the Ack goes back. A timeout or a dead peer on the way:
DecodeTimeout (fence, free, Nack). No room: DecodeReject (Nack).

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
from typing import Any

import torch

from refimpl.cluster.control import Message
from refimpl.cluster.kvpath import RAW_TAG, DecodeKV, Incoming, data_tag
from refimpl.cluster.worker import Base, WorkerArgs
from refimpl.errors import OwnershipError
from refimpl.model import PagedKV


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
        self.kv = DecodeKV(self.spec.model(), self.spec.block_size, a.capacity)
        self.running: dict[str, Running] = {}
        self.backlog: list[Message] = []
        self.prefill_down = False
        self.raw_posted: set[int] = set()
        self.raw_sizes: list[list[int]] | None = None

    def loop(self) -> None:
        while not self.stop:
            msgs, self.backlog = self.backlog + self.ch.poll(), []
            for m in msgs:
                self.handle(m)
            busy = self.step()
            if not msgs and not busy:
                time.sleep(0.001)

    def handle(self, m: Message) -> None:
        getattr(self, f"on_{m['kind']}")(m)

    # ------------------------------------------------------------------ handoff
    def on_handoff(self, m: Message) -> None:
        rid, epoch = m["rid"], int(m["epoch"])
        if self.prefill_down:
            return  # its sender is gone; the router fails the request
        try:
            man = self.kv.accept(m["manifest"])
        except OwnershipError as e:
            self.ch.send("p0", "nack", rid=rid, epoch=epoch, reason=f"manifest: {e}")
            return
        room = int(m["steps"]) + 1
        if not self.kv.can_reserve(man, room):
            self.event("DecodeReject", rid, msg="Handoff", epoch=epoch, idx=0)
            self.ch.send("p0", "nack", rid=rid, epoch=epoch, reason="no room on decode")
            return
        inc = self.kv.reserve(man, room)
        self.event("DecodeReserve", rid, msg="Handoff", epoch=epoch, idx=0)
        t_ready = time.perf_counter()
        self.ch.send("p0", "ready", rid=rid, epoch=epoch)
        stats, why = self.receive(inc, t_ready)
        if why is not None:
            self.event("DecodeTimeout", rid)
            self.kv.abort(rid)
            self.ch.send("p0", "nack", rid=rid, epoch=epoch, reason=why)
            return
        self.event("DecodeCommit", rid)
        self.ch.send("p0", "ack", rid=rid, epoch=epoch)
        stats["commit"] = time.perf_counter()
        stats = {k: v - t_ready for k, v in stats.items()}
        stats["bytes"] = float(self.kv.rank_bytes(inc) * man.src_tp)
        self.report("committed", rid=rid, stats=stats)
        first = int(m["first"])
        cs = m.get("cancel_step")
        self.running[rid] = Running(
            rid, self._store, [first], man.num_tokens, int(m["steps"]), stats=stats,
            cancel_step=None if cs is None else int(cs),
        )  # fmt: skip

    def receive(self, inc: Incoming, t_ready: float) -> tuple[dict[str, float], str | None]:
        """Every rank's RankDone (each posts that rank's receive), its bytes, verified,
        staged and committed; or why not, within the timeout."""
        m, tp = inc.m, inc.m.src_tp
        rid, size = m.request_id, self.kv.rank_bytes(inc)
        sums: dict[int, list[str]] = {}
        bufs: dict[int, torch.Tensor] = {}
        works: dict[int, Any] = {}
        deadline = time.monotonic() + self.a.timeout_s
        stats: dict[str, float] = {}
        while len(sums) < tp:
            if time.monotonic() > deadline:
                return stats, f"RankDone missing from ranks {sorted(set(range(tp)) - set(sums))}"
            got = self.ch.poll()
            for msg in got:
                kind = msg["kind"]
                if kind == "rankdone" and msg["rid"] == rid and msg["epoch"] == m.epoch:
                    r = int(msg["rank"])
                    if int(msg["nbytes"]) != size:
                        return stats, f"rank {r} sends {msg['nbytes']} bytes, expected {size}"
                    sums[r] = list(msg["sums"])
                    bufs[r] = torch.empty(size, dtype=torch.uint8)
                    works[r] = self.pairs.irecv(f"p{r}", bufs[r], data_tag(rid, m.epoch))
                elif kind == "rankdone":
                    self.on_rankdone(msg)
                elif kind == "dead" and msg["who"].startswith("p"):
                    self.learned(msg)
                    self.backlog.append(msg)
                    return stats, f"prefill rank {msg['who']} died"
                else:
                    self.backlog.append(msg)
            if not got:
                time.sleep(0.0005)
        stats["rankdone"] = time.perf_counter()
        for r in range(tp):
            if works[r] is None or not self.wait(works[r]):
                return stats, f"rank {r}'s bytes did not arrive (peer dead or timeout)"
        stats["data"] = time.perf_counter()
        try:
            for r in range(tp):
                self.kv.land(inc, r, bufs[r], sums[r])
            self.kv.validate(inc, sums)
        except OwnershipError as e:
            return stats, f"verification failed: {e}"
        stats["verified"] = time.perf_counter()
        n = len(inc.stage_ids)
        for r in range(tp):
            for j in range(n):
                self.event(
                    "DecodeReceiveChunk", m.request_id, msg="Chunk", epoch=m.epoch, idx=r * n + j
                )
            self.event("DecodeReceiveDone", m.request_id, msg="RankDone", epoch=m.epoch, idx=r)
        self.event("DecodeValidate", m.request_id)
        self._store = self.kv.commit(inc)
        return stats, None

    # ------------------------------------------------------------------ decoding
    def step(self) -> bool:
        for r in list(self.running.values()):
            if r.cancel_step is not None and r.done >= r.cancel_step and not r.cancelled:
                self.event("ClientCancel", r.rid)  # the client's cancel, at its planned step
                r.cancelled = True
            if r.cancelled and self.a.mutant != "cancel_ignored":
                self.event("DecodeAbort", r.rid)
                self.kv.finish(r.rid)
                del self.running[r.rid]
                self.report("outcome", rid=r.rid, outcome="cancelled", reason="cancelled on decode")
                continue
            if r.steps > 0:
                logits = self.kv.model.decode_step(r.tokens[-1], r.position, r.store)
                r.tokens.append(int(logits.argmax()))
                r.position += 1
                r.steps -= 1
                r.done += 1
                self.event("DecodeStep", r.rid)
                continue
            self.event("DecodeFinish", r.rid)
            self.kv.finish(r.rid)
            del self.running[r.rid]
            self.report("outcome", rid=r.rid, outcome="finished", tokens=r.tokens, stats=r.stats)
        return bool(self.running)

    def on_cancel(self, m: Message) -> None:
        r = self.running.get(m["rid"])
        if r is not None and not r.cancelled:
            self.event("ClientCancel", r.rid)
            r.cancelled = True

    def on_rankdone(self, m: Message) -> None:
        """The RankDone of an attempt that ended here (fenced): its bytes are received
        into scratch and dropped, so that the sender's posted send completes."""
        src = int(m["rank"])
        if f"p{src}" in self.dead:
            return
        scratch = torch.empty(int(m["nbytes"]), dtype=torch.uint8)
        work = self.pairs.irecv(f"p{src}", scratch, data_tag(m["rid"], int(m["epoch"])))
        if work is not None:
            self.wait(work)

    # ------------------------------------------------------------------ the router
    def on_dead(self, m: Message) -> None:
        self.learned(m)
        self.dead.add(m["who"])
        if m["who"].startswith("p"):
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
        integrity: str | None = None
        try:
            self.kv.alloc.check_integrity()
        except Exception as e:  # noqa: BLE001 (reported to the router as text)
            integrity = str(e)
        self.bye(self.kv.held(), integrity)
