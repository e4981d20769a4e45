"""A prefill TP rank: one ``refimpl.api.ranks`` ``RankSender`` per decode worker, over its
own heads. Rank 0 is the leader: it speaks for the prefill worker of the spec (admit, run,
the offer, Ready, Ack, Nack, timeouts, cancels); every rank offers the same attempt (its
epoch from ``Epochs`` over the router's store) and sends each decode rank its slice when
that rank's ready reaches it. The API conversation rides ``link.Link``.

Per request, on the leader (``phase``):

    admitted     prefilled here; waiting for every rank's "frozen" (it prefilled too)
    await_ready  PrefillFreeze logged, a "handoff" (first token, steps) to every decode
                 rank of its worker, then the offer (every layer computed: sent)
    await_ack    Ready: PrefillRecvReady logged, "go" sent to the other ranks (each then
                 offers the same attempt), own chunks and seal sent
    (gone)       Ack (every decode rank installed, and with decode TP > 1 the decode
                 leader's "commit"): PrefillRelease, every rank drops the request

A Nack resumes the source (PrefillResume) and, once, retries with the next epoch. No word
from decode in time, or decode died: PrefillTimeout, the request fails (fail closed). A
cancel before the offer ends it here (ClientCancel, PrefillQuiesce); after it, decode's
word decides: on the Ack it goes on to decode, on a Nack it ends here. A crash of any rank
is the prefill worker's crash (spec ``EnvCrash``): every rank stops, drops what it holds,
and comes back as the new incarnation (``restart_self``). At the router's shutdown a rank
says bye once nothing is in flight (``settled``; at most ACK_WAIT or CLOSE_WAIT timeouts).
Mutant ``release_before_install``: every rank frees its source blocks once its chunks are
sent, before the Ack; the leader logs what its allocator holds (``observed.p``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from refimpl.api import State
from refimpl.api.ranks import Epochs, RankSender, rank_route
from refimpl.cluster.control import Message
from refimpl.cluster.ends import channel_proc, held, prefill_end, rank_sender
from refimpl.cluster.link import RAW_TAG, Link, base_rid, is_link_message, rid_of
from refimpl.cluster.worker import CLOSE_WAIT, Base, WorkerArgs, proc_name
from refimpl.errors import OwnershipError

MAX_ATTEMPTS = 2
# Decode decides an attempt within two of its own timeouts, so prefill waits three for
# the Ack: its timeout never races a commit on a live decode.
ACK_WAIT = 3
VOID = 1 << 62  # a fence above every epoch: a dropped request's late replies go


@dataclass
class PReq:
    rid: str
    prompt: tuple[int, ...]
    steps: int
    first: int
    epoch: int = 1
    phase: str = "admitted"
    frozen: set[int] = field(default_factory=set)  # ranks that prefilled it
    deadline: float = 0.0
    cancel_pending: bool = False
    decode: str = "d0"  # the decode worker the router chose
    cancel_step: int | None = None  # the client cancels after this many decode steps
    cancel_logged: bool = False


class PrefillWorker(Base):
    def __init__(self, a: WorkerArgs) -> None:
        super().__init__(a)
        self.leader = a.rank == 0
        self.link = Link(self.ch, self.pairs, self.route, self.wait)
        self.epochs = Epochs(self.store)  # the router's store: one epoch per attempt
        self.w, tx0 = prefill_end(
            self.spec.model(), a.prefill_tp, a.rank, self.spec.block_size, a.capacity,
            self.link, dst_tp=a.decode_tp, epochs=self.epochs, inc=a.inc,
        )  # fmt: skip
        self.txs = {"d0": tx0}  # per decode worker: its ranks' incarnations are its own
        p, d = a.prefill_tp, a.decode_tp
        self.ranks = rank_route(range(p), range(p, p + d), self.spec.kv_heads)
        self.reqs: dict[str, PReq] = {}
        self.others = [f"p{r}" for r in range(1, a.prefill_tp)]
        self.down = False  # the prefill worker crashed (one of its ranks): stop until restart
        self.dest: dict[str, str] = {}  # rid -> its decode worker (every rank)
        self.prompts: dict[str, tuple[int, ...]] = {}  # rid -> its prompt (every rank)
        self.offered: dict[str, State] = {}  # rid -> its offer's state when last seen
        self.admits: list[Message] = []  # admitted, not yet prefilled (one per loop turn)
        self.early: dict[str, list[Message]] = {}  # other ranks' "frozen" before our admit
        self.ended: set[str] = set()  # requests this leader is done with
        self.decided: set[str] = set()  # the decode leader committed them (decode TP > 1)

    def route(self, channel: str) -> str:
        worker = self.dest.get(base_rid(rid_of(channel)), "d0")
        return channel_proc(self.ranks, self.a.prefill_tp, worker, channel)

    # ------------------------------------------------------------------ messages
    def handle(self, m: Message) -> None:
        kind = m["kind"]
        if is_link_message(m):
            self.link.deliver(m)
            return
        if kind == "shutdown":  # the leader's open requests end first, then every rank's
            self.begin_close(ACK_WAIT if self.leader else CLOSE_WAIT)
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
        logits, _ = self.w.prefill(rid, torch.tensor(list(prompt)))
        self.prompts[rid] = prompt
        if not self.leader:
            self.ch.send("p0", "frozen", rid=rid, epoch=1, rank=self.a.rank)
            return
        self.event("PrefillAdmit", rid)
        self.event("PrefillRun", rid)
        first = int(logits[-1].argmax())
        r = PReq(rid, prompt, int(m["steps"]), first, frozen={0}, decode=self.dest[rid])
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
        if r is not None and r.phase == "admitted":
            r.frozen.add(int(m["rank"]))
            self.maybe_handoff(r)

    def maybe_handoff(self, r: PReq) -> None:
        if r.phase != "admitted" or len(r.frozen) < self.a.prefill_tp:
            return
        if r.cancel_pending:
            self.cancel_here(r)
            return
        r.epoch = self.epochs.open(r.rid)  # this attempt's, for every rank of both sides
        try:
            self.offer(r.rid, r.epoch)  # queued: the manifest goes after the handoff
        except (ValueError, OwnershipError) as e:  # its blocks are gone (the mutant)
            self.fail(r, f"offer refused: {e}")
            return
        self.event("PrefillFreeze", r.rid)
        k = int(r.decode[1:])
        for j in range(self.a.decode_tp):  # every decode rank of the worker expects it
            self.ch.send(
                proc_name("decode", k, j), "handoff", rid=r.rid, epoch=r.epoch, first=r.first,
                steps=r.steps, cancel_step=r.cancel_step, tokens=len(r.prompt),
            )  # fmt: skip
        r.phase, r.deadline = "await_ready", self.now() + self.a.ready_wait_s
        if r.decode in self.dead:
            r.deadline = 0.0

    def offer(self, rid: str, epoch: int) -> None:
        """This rank's offer of the attempt, every layer computed already."""
        self.end_offer(rid)
        prompt = self.prompts[rid]
        blocks = self.alloc.blocks_of(rid)[: self.w.geometry.blocks_for(len(prompt))]
        self.tx(rid).offer(rid, prompt, blocks=blocks)  # at Epochs' current: ``epoch``
        for layer in range(self.w.geometry.num_layers):
            self.tx(rid).send_layer(rid, layer)
        self.offered[rid] = State.OFFERED

    def end_offer(self, rid: str) -> None:
        """This rank's offer of ``rid`` is over (its reply read, or aborted): forget it."""
        if rid not in self.offered:
            return
        self.tx(rid).poll(rid)
        if not self.tx(rid).state(rid).final:
            self.tx(rid).abort(rid, "ended by the prefill leader")
        self.tx(rid).forget(rid)
        del self.offered[rid]

    def poll_offers(self) -> bool:
        """Read the Receiver's replies of every offer: the events of what they did."""
        moved = False
        for rid in list(self.offered):
            was = self.offered[rid]
            moved |= self.tx(rid).poll(rid) > 0
            now = self.tx(rid).state(rid)
            if not now.final:  # the group is SENDING from the offer on: Ready is ``answered``
                now = State.SENDING if self.tx(rid).answered(rid) else State.OFFERED
            elif now is State.DONE and self.a.decode_tp > 1 and rid not in self.decided:
                now = State.SENDING  # every decode rank installed: its leader's word is next
            self.offered[rid] = now
            if now is was:
                continue
            if was is State.OFFERED and self.tx(rid).answered(rid):  # Ready came
                self.on_ready(rid)
            if now.final:
                (self.on_ack if now is State.DONE else self.on_nack)(rid)
        return moved

    def on_ready(self, rid: str) -> None:
        """The Sender heard Ready (and sent this rank's chunks and seal, queued)."""
        r = self.reqs.get(rid)
        if r is not None and r.phase == "await_ready":
            self.event("PrefillRecvReady", rid, msg="Ready", epoch=r.epoch, idx=0)
            self.tell_others("go", rid=rid, epoch=r.epoch, decode=r.decode)
            r.phase, r.deadline = "await_ack", self.now() + ACK_WAIT * self.a.timeout_s
        elif self.leader:
            return
        for _ in self.alloc.blocks_of(rid):
            self.event("PrefillSendChunk", rid)
        if self.a.mutant == "release_before_install":
            self.alloc.free(rid)  # the bug: the source is freed before decode installed it
        obs = {"p": "complete" if self.alloc.blocks_of(rid) else "none"} if self.leader else None
        self.event("PrefillSendChunk", rid, observed=obs)

    def on_go(self, m: Message) -> None:
        rid, epoch = m["rid"], int(m["epoch"])
        self.dest[rid] = m.get("decode", self.dest.get(rid, "d0"))
        if rid in self.prompts and self.alloc.blocks_of(rid):
            self.offer(rid, epoch)

    def on_ack(self, rid: str) -> None:
        r = self.reqs.get(rid)
        if r is None or r.phase != "await_ack":
            return
        self.event("PrefillRelease", r.rid, msg="Ack", epoch=r.epoch, idx=0)
        self.drop(r.rid)
        self.tell_others("drop", rid=r.rid)
        del self.reqs[r.rid]
        self.ended.add(r.rid)
        self.early.pop(r.rid, None)
        if r.cancel_pending:
            self.ch.send(r.decode, "cancel", rid=r.rid)

    def on_nack(self, rid: str) -> None:
        r = self.reqs.get(rid)
        if r is None or r.phase not in ("await_ready", "await_ack"):
            return
        self.event("PrefillResume", r.rid, msg="Nack", epoch=r.epoch, idx=0)
        why = "; ".join(self.tx(rid).reasons(rid))
        self.tell_others("release", rid=r.rid, epoch=r.epoch)
        self.end_offer(rid)
        if r.cancel_pending:
            self.cancel_here(r)
            return
        if r.epoch >= MAX_ATTEMPTS:
            self.fail(r, f"decode refused {MAX_ATTEMPTS} attempts ({why})")
            return
        r.phase = "admitted"  # every rank still holds its blocks: offer again at once
        self.maybe_handoff(r)

    def on_commit(self, m: Message) -> None:
        """Decode TP > 1: the decode leader logged its commit; the release may follow."""
        if m["rid"] in self.offered:
            self.decided.add(m["rid"])

    def on_release(self, m: Message) -> None:
        self.end_offer(m["rid"])

    def on_drop(self, m: Message) -> None:
        self.admits = [a for a in self.admits if a["rid"] != m["rid"]]
        self.drop(m["rid"])

    def drop(self, rid: str) -> None:
        """The request is over on this rank: its offer, its blocks, its late replies."""
        self.end_offer(rid)
        self.decided.discard(rid)
        [self.link.fence(inbox, VOID) for inbox in self.tx(rid).inboxes(rid)]
        self.alloc.free(rid)
        self.prompts.pop(rid, None)

    def on_cancel(self, m: Message) -> None:
        r = self.reqs.get(m["rid"])
        queued = [a for a in self.admits if a["rid"] == m["rid"]]
        if queued:  # not prefilled yet: the request ends before it holds anything
            self.admits.remove(queued[0])
            self.early.pop(m["rid"], None)
            self.ended.add(m["rid"])
            self.event("ClientCancel", m["rid"])
            self.tell_others("drop", rid=m["rid"])
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
        """The benchmark's baseline: this rank's share of the same bytes, raw sends
        (posted, then retired by ``Link.retire``, never timed out: that closes the pair)."""
        for i, s in enumerate(m["sizes"]):
            self.link.post(m["to"], torch.ones(int(s[self.a.rank]), dtype=torch.uint8), RAW_TAG + i)
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
        """Over on prefill: its blocks go on every rank; a later turn finds it ended."""
        self.drop(r.rid)
        self.tell_others("drop", rid=r.rid)
        self.reqs.pop(r.rid, None)
        r.phase = "ended"
        self.ended.add(r.rid)
        self.early.pop(r.rid, None)

    def tell_others(self, kind: str, **body: Any) -> None:
        for p in self.others:
            self.ch.send(p, kind, **body)

    def step(self) -> bool:
        busy = self.link.retire()
        if self.admits and not self.down:
            self.on_admit(self.admits.pop(0))  # one prefill, then the control again
            busy = True
        if not self.down:
            busy |= self.poll_offers()
        if self.leader and not self.down:
            now = self.now()
            for r in list(self.reqs.values()):
                late = now >= r.deadline or (self.closing is not None and now >= self.closing)
                if r.phase in ("await_ready", "await_ack") and late:
                    self.event("PrefillTimeout", r.rid)
                    d, t = r.decode, self.a.timeout_s
                    gone = f"decode worker {d} died"
                    why = gone if d in self.dead else f"no word from decode {d} in {t}s"
                    self.fail(r, f"prefill timeout: {why}")
                    busy = True
        self.link.flush()  # after the events of what was sent are logged
        return busy

    def on_dead(self, who: str) -> None:
        self.dead.add(who)
        if who.startswith("p"):
            # The prefill worker crashed (spec EnvCrash): this rank stops, says its clock.
            self.down = True
            for rid in list(self.alloc.holders()):
                self.alloc.free(rid)
            self.txs.clear()  # its offers are gone
            self.link.clear()
            for d in (self.reqs, self.offered, self.prompts, self.early):
                d.clear()
            self.admits.clear()
            self.report("stopped", lc=self.log.lc)
        else:
            for r in self.reqs.values():
                if r.decode == who and r.phase in ("await_ready", "await_ack"):
                    r.deadline = 0.0

    def restart_self(self, inc: int) -> None:
        """The restarted prefill worker: this rank as incarnation ``inc``, pools empty."""
        self.down = False
        self.txs.clear()
        self.link.clear()
        self.dest.clear()
        self.ended.clear()
        self.dead = {w for w in self.dead if not w.startswith("p")}

    def tx(self, rid: str) -> RankSender:
        """This rank's RankSender to the request's decode worker (made when first used)."""
        a, d = self.a, self.dest.get(rid, "d0")
        t = self.txs.get(d) or rank_sender(self.w, a.rank, self.link, dst_tp=a.decode_tp,
                                           epochs=self.epochs, inc=self.ch.inc)  # fmt: skip
        return self.txs.setdefault(d, t)

    def settled(self) -> bool:
        """No request open on the leader, no offer or block on any rank."""
        return not self.reqs and not self.offered and held(self.alloc) == 0
