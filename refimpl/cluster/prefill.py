"""A prefill TP rank. Rank 0 is the leader: it speaks for the prefill worker of the spec
(admit, run, freeze, the manifest, Ready, Ack, Nack, timeouts, cancels); every rank
sends its own shard and its own RankDone.

Per request, on the leader (``phase``):

    admitted     prefilled here; waiting for every rank's shard checksums ("frozen")
    await_ready  PrefillFreeze logged, Handoff (manifest) sent to decode
    await_ack    PrefillRecvReady logged, "go" sent to the other ranks, own shard and
                 RankDone sent
    (gone)       Ack: PrefillRelease, every rank drops the request's blocks

A Nack (decode had no room, or timed out) resumes the source (PrefillResume) and, once,
retries with the next epoch. No word from decode in time (``ready_wait_s`` for Ready,
``ACK_WAIT`` timeouts for the Ack), or the router says decode died: PrefillTimeout,
the request fails (fail closed). A cancel before the freeze ends the request here
(ClientCancel, PrefillQuiesce); after it, the cancel waits for decode's word: on the
Ack it goes on to decode, on a Nack it is applied here.

Each request goes to the decode worker the router names in its admit (``decode``). A
cancel is a client event the router plans at a point of the request's own life (the
admit's ``cancel``: ``queued``, ``prefilled`` or ``decode:K``, after K decode steps), so
that the same seed cancels the same requests whatever the processes' timing.

A crash of any rank is the prefill worker's crash (spec ``EnvCrash``): every rank stops
and drops what it holds. When the router restarts the worker, every rank takes the new
incarnation (``restart_self``) with empty pools and joins new pair groups.

Mutant ``release_before_install`` (spec/mutants.py): every rank frees its source
blocks as soon as its shard is sent, before the Ack. The leader's log states what its
allocator holds after its RankDone (``observed.p``), which is how the checker sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from refimpl.cluster.control import Message
from refimpl.cluster.kvpath import RAW_TAG, PrefillKV, data_tag
from refimpl.cluster.worker import Base, WorkerArgs

MAX_ATTEMPTS = 2
# Decode decides an attempt within two of its own timeouts (bytes, then RankDones), so
# prefill waits three for the Ack: its timeout never races a commit on a live decode.
ACK_WAIT = 3


@dataclass
class PReq:
    rid: str
    prompt: tuple[int, ...]
    steps: int
    first: int
    epoch: int = 1
    phase: str = "admitted"
    sums: dict[int, list[str]] = field(default_factory=dict)
    deadline: float = 0.0
    cancel_pending: bool = False
    decode: str = "d0"  # the decode worker the router chose
    cancel_step: int | None = None  # the client cancels after this many decode steps
    cancel_logged: bool = False


class PrefillWorker(Base):
    def __init__(self, a: WorkerArgs) -> None:
        super().__init__(a)
        self.leader = a.rank == 0
        self.kv = PrefillKV(
            self.spec.model(), a.prefill_tp, a.rank, self.spec.block_size, a.capacity
        )
        self.reqs: dict[str, PReq] = {}
        self.others = [f"p{r}" for r in range(1, a.prefill_tp)]
        self.down = False  # the prefill worker crashed (one of its ranks): stop until restart
        self.dest: dict[str, str] = {}  # rid -> its decode worker (every rank)
        self.bytes_sent = 0
        self.pending: list[tuple[Any, torch.Tensor, float]] = []  # posted sends
        self.admits: list[Message] = []  # admitted, not yet prefilled (one per loop turn)
        self.early: dict[str, list[Message]] = {}  # other ranks' "frozen" before our admit
        self.ended: set[str] = set()  # requests this leader is done with

    # ------------------------------------------------------------------ messages
    def handle(self, m: Message) -> None:
        kind = m["kind"]
        if kind == "shutdown":
            self.shutdown()
            return
        if kind == "dead":
            self.learned(m)
            self.on_dead(m["who"])
            return
        if kind == "restarted":
            self.on_restarted(m)
            return
        if self.down:
            return
        if kind == "admit":  # compute waits; control goes first (see step)
            if m.get("cancel") == "queued":  # the client cancels before it is prefilled
                if self.leader:
                    self.ended.add(m["rid"])
                    self.event("ClientCancel", m["rid"])
                    self.report(
                        "outcome", rid=m["rid"], outcome="cancelled", reason="cancelled queued"
                    )
                return
            self.dest[m["rid"]] = m.get("decode", "d0")
            self.admits.append(m)
            return
        getattr(self, f"on_{kind}")(m)

    def on_admit(self, m: Message) -> None:
        rid, prompt = m["rid"], tuple(m["prompt"])
        first = self.kv.prefill(rid, prompt)
        sums = self.kv.freeze(rid, 1)
        if not self.leader:
            self.ch.send("p0", "frozen", rid=rid, epoch=1, rank=self.a.rank, sums=sums)
            return
        self.event("PrefillAdmit", rid)
        self.event("PrefillRun", rid)
        r = PReq(rid, prompt, int(m["steps"]), first, sums={0: sums}, decode=self.dest[rid])
        cancel = m.get("cancel")
        if cancel == "prefilled":
            self.event("ClientCancel", rid)
            r.cancel_pending = r.cancel_logged = True
        elif isinstance(cancel, str) and cancel.startswith("decode:"):
            r.cancel_step = int(cancel.split(":")[1])
        self.reqs[rid] = r
        for early in self.early.pop(rid, []):
            self.on_frozen(early)
        self.maybe_handoff(r)

    def on_frozen(self, m: Message) -> None:
        r = self.reqs.get(m["rid"])
        if r is None and m["rid"] not in self.ended:
            self.early.setdefault(m["rid"], []).append(m)  # that rank prefilled first
            return
        if r is not None and r.phase == "admitted" and m["epoch"] == r.epoch:
            r.sums[int(m["rank"])] = list(m["sums"])
            self.maybe_handoff(r)

    def maybe_handoff(self, r: PReq) -> None:
        if r.phase != "admitted" or len(r.sums) < self.a.prefill_tp:
            return
        if r.cancel_pending:
            self.cancel_here(r)
            return
        ranks = [r.sums[k] for k in range(self.a.prefill_tp)]
        man = self.kv.manifest(r.rid, r.epoch, r.prompt, ranks)
        self.event("PrefillFreeze", r.rid)
        self.ch.send(
            r.decode, "handoff", rid=r.rid, epoch=r.epoch, manifest=man.to_json_dict(),
            first=r.first, steps=r.steps, cancel_step=r.cancel_step,
        )  # fmt: skip
        r.phase, r.deadline = "await_ready", self.now() + self.a.ready_wait_s
        if r.decode in self.dead:
            r.deadline = 0.0

    def on_ready(self, m: Message) -> None:
        r = self.reqs.get(m["rid"])
        if r is None or r.phase != "await_ready" or m["epoch"] != r.epoch:
            return  # stale (PrefillDiscard, assumable: not logged)
        self.event("PrefillRecvReady", r.rid, msg="Ready", epoch=r.epoch, idx=0)
        for p in self.others:
            self.ch.send(p, "go", rid=r.rid, epoch=r.epoch, decode=r.decode)
        r.phase, r.deadline = "await_ack", self.now() + ACK_WAIT * self.a.timeout_s
        self.send_shard(r.rid, r.epoch, r.sums[0])

    def on_go(self, m: Message) -> None:
        rid, epoch = m["rid"], int(m["epoch"])
        self.dest[rid] = m.get("decode", self.dest.get(rid, "d0"))
        self.send_shard(rid, epoch, None)

    def send_shard(self, rid: str, epoch: int, sums: list[str] | None) -> None:
        """This rank's chunks (one point-to-point send, posted), then its RankDone.

        The send is posted before the RankDone goes out, and decode posts its receive
        only when the RankDone arrives, so no receive ever waits on a send that will not
        come (a timed-out gloo wait closes the pair for good)."""
        if (rid, epoch) not in self.kv.snaps:
            return
        data = self.kv.payload(rid, epoch)
        decode = self.dest.get(rid, "d0")
        try:
            work = self.pairs.isend(decode, data, data_tag(rid, epoch))
        except RuntimeError:
            work = None
        if work is None:
            return  # decode's end of the pair is gone: the router says so, we time out
        self.pending.append((work, data, self.now() + ACK_WAIT * self.a.timeout_s))
        sums = sums if sums is not None else list(self.kv.snaps[(rid, epoch)].checksums)
        for _ in sums:
            self.event("PrefillSendChunk", rid)
        if self.a.mutant == "release_before_install":
            self.kv.drop(rid)  # the bug: the source is freed before decode installed it
        obs = None
        if self.leader:
            obs = {"p": "complete" if self.kv.alloc.blocks_of(rid) else "none"}
        self.event("PrefillSendChunk", rid, observed=obs)
        self.ch.send(
            decode, "rankdone", rid=rid, epoch=epoch, rank=self.a.rank, sums=sums,
            nbytes=data.numel(),
        )  # fmt: skip

    def sends_done(self) -> bool:
        """Retire completed sends (their bytes count); give up on those past deadline."""
        keep, now = [], self.now()
        for work, data, deadline in self.pending:
            try:
                done = work.is_completed()
            except RuntimeError:
                continue  # decode is gone
            if done:
                self.bytes_sent += data.numel()
            elif now < deadline:
                keep.append((work, data, deadline))
        busy = bool(self.pending)
        self.pending = keep
        return busy

    def on_ack(self, m: Message) -> None:
        r = self.reqs.get(m["rid"])
        if r is None or r.phase != "await_ack" or m["epoch"] != r.epoch:
            return
        self.event("PrefillRelease", r.rid, msg="Ack", epoch=r.epoch, idx=0)
        self.drop_everywhere(r.rid)
        del self.reqs[r.rid]
        self.ended.add(r.rid)
        self.early.pop(r.rid, None)
        if r.cancel_pending:
            self.ch.send(r.decode, "cancel", rid=r.rid)

    def on_nack(self, m: Message) -> None:
        r = self.reqs.get(m["rid"])
        if r is None or r.phase not in ("await_ready", "await_ack") or m["epoch"] != r.epoch:
            return
        self.event("PrefillResume", r.rid, msg="Nack", epoch=r.epoch, idx=0)
        for p in self.others:
            self.ch.send(p, "release", rid=r.rid, epoch=r.epoch)
        self.kv.release(r.rid, r.epoch)
        if r.cancel_pending:
            self.cancel_here(r)
            return
        if r.epoch >= MAX_ATTEMPTS:
            self.fail(r, f"decode refused {MAX_ATTEMPTS} attempts ({m.get('reason', '')})")
            return
        r.epoch += 1
        r.phase, r.sums = "admitted", {0: self.kv.freeze(r.rid, r.epoch)}
        for p in self.others:
            self.ch.send(p, "refreeze", rid=r.rid, epoch=r.epoch)
        self.maybe_handoff(r)

    def on_release(self, m: Message) -> None:
        self.kv.release(m["rid"], int(m["epoch"]))

    def on_refreeze(self, m: Message) -> None:
        rid, epoch = m["rid"], int(m["epoch"])
        sums = self.kv.freeze(rid, epoch)
        self.ch.send("p0", "frozen", rid=rid, epoch=epoch, rank=self.a.rank, sums=sums)

    def on_drop(self, m: Message) -> None:
        self.admits = [a for a in self.admits if a["rid"] != m["rid"]]
        self.kv.drop(m["rid"])

    def on_cancel(self, m: Message) -> None:
        r = self.reqs.get(m["rid"])
        queued = [a for a in self.admits if a["rid"] == m["rid"]]
        if queued:  # not prefilled yet: the request ends before it holds anything
            self.admits.remove(queued[0])
            self.early.pop(m["rid"], None)
            self.ended.add(m["rid"])
            self.event("ClientCancel", m["rid"])
            for p in self.others:
                self.ch.send(p, "drop", rid=m["rid"])
            self.report("outcome", rid=m["rid"], outcome="cancelled", reason="cancelled queued")
        elif r is None:
            self.ch.send(self.dest.get(m["rid"], "d0"), "cancel", rid=m["rid"])  # decode owns it
        elif r.phase == "admitted":
            self.cancel_here(r)
        else:
            r.cancel_pending = True  # decode's word decides (Ack: forward; Nack: here)

    def on_status(self, m: Message) -> None:
        self.report("status", open=sorted(self.reqs))

    def on_raw(self, m: Message) -> None:
        """The benchmark's baseline: this rank's share of the same bytes, raw sends."""
        sizes = [int(s[self.a.rank]) for s in m["sizes"]]
        bufs = [torch.ones(n, dtype=torch.uint8) for n in sizes]
        deadline = self.now() + ACK_WAIT * self.a.timeout_s + 10.0
        for i, b in enumerate(bufs):  # posted, then retired by sends_done (never timed out:
            work = self.pairs.isend(m["to"], b, RAW_TAG + i)  # that closes the pair)
            if work is not None:
                self.pending.append((work, b, deadline))
        self.ch.send(m["to"], "raw_posted", rank=self.a.rank)

    # ------------------------------------------------------------------ endings
    def cancel_here(self, r: PReq) -> None:
        if not r.cancel_logged:
            self.event("ClientCancel", r.rid)
        self.event("PrefillQuiesce", r.rid)
        self.end_here(r)
        self.report("outcome", rid=r.rid, outcome="cancelled", reason="cancelled on prefill")

    def fail(self, r: PReq, reason: str) -> None:
        self.end_here(r)
        self.report("outcome", rid=r.rid, outcome="failed", reason=reason)

    def end_here(self, r: PReq) -> None:
        """The request is over on prefill: its blocks go on every rank, and a later turn
        (an early "frozen" handled in the same admit) finds it ended."""
        self.drop_everywhere(r.rid)
        del self.reqs[r.rid]
        r.phase = "ended"
        self.ended.add(r.rid)
        self.early.pop(r.rid, None)

    def drop_everywhere(self, rid: str) -> None:
        self.kv.drop(rid)
        for p in self.others:
            self.ch.send(p, "drop", rid=rid)

    def step(self) -> bool:
        busy = self.sends_done()
        if self.admits and not self.down:
            self.on_admit(self.admits.pop(0))  # one prefill, then the control again
            busy = True
        if not self.leader or self.down:
            return busy
        now = self.now()
        for r in list(self.reqs.values()):
            if r.phase in ("await_ready", "await_ack") and now >= r.deadline:
                self.event("PrefillTimeout", r.rid)
                why = (
                    f"decode worker {r.decode} died"
                    if r.decode in self.dead
                    else f"no word from decode {r.decode} in {self.a.timeout_s}s"
                )
                self.fail(r, f"prefill timeout: {why}")
                busy = True
        return busy

    def on_dead(self, who: str) -> None:
        self.dead.add(who)
        if who.startswith("p"):
            # The prefill worker has crashed: its replicas are gone (spec EnvCrash). This
            # rank stops for good and tells the router where its clock stands.
            self.down = True
            for rid in list(self.kv.w.rp.alloc.holders()):
                self.kv.alloc.free(rid)
            self.kv.snaps.clear()
            self.reqs.clear()
            self.admits.clear()
            self.early.clear()
            self.report("stopped", lc=self.log.lc)
        else:
            for r in self.reqs.values():
                if r.decode == who and r.phase in ("await_ready", "await_ack"):
                    r.deadline = 0.0

    def restart_self(self, inc: int) -> None:
        """The restarted prefill worker: this rank comes back as incarnation ``inc``, its
        pools empty (on_dead emptied them) and no request of the old one left."""
        self.down = False
        self.dest.clear()
        self.ended.clear()
        self.pending.clear()
        self.dead = {w for w in self.dead if not w.startswith("p")}

    def shutdown(self) -> None:
        integrity: str | None = None
        try:
            self.kv.alloc.check_integrity()
        except Exception as e:  # noqa: BLE001 (reported to the router as text)
            integrity = str(e)
        self.bye(self.kv.held(), integrity)
