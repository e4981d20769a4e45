"""A prefill TP rank: one ``refimpl.api`` ``Sender(..., rank=r)`` over its own heads.
Rank 0 is the leader: it speaks for the prefill worker of the spec (admit, run, the
offer and its manifest, Ready, Ack, Nack, timeouts, cancels); every rank offers the same
attempt (same epoch) and sends its own chunks and seal when the Receiver's ready reaches
it. The API conversation (``refimpl.api.wire``) rides ``link.Link``.

Per request, on the leader (``phase``):

    admitted     prefilled here; waiting for every rank's "frozen" (it prefilled too)
    await_ready  PrefillFreeze logged, a "handoff" (first token, steps) to decode, then
                 the offer: its manifest (every layer computed: ``send_layer`` for all)
    await_ack    the Sender saw Ready: PrefillRecvReady logged, "go" sent to the other
                 ranks (each then offers the same attempt), own chunks and seal sent
    (gone)       Ack: PrefillRelease, every rank drops the request's blocks

A Nack (decode refused it, had no room, timed out, or a check failed) resumes the source
(PrefillResume) and, once, retries with the next epoch. No word from decode in time
(``ready_wait_s`` for Ready, ``ACK_WAIT`` timeouts for the Ack), or the router says
decode died: PrefillTimeout, the request fails (fail closed; the Sender's abort tells
decode). A cancel before the offer ends the request here (ClientCancel,
PrefillQuiesce); after it, the cancel waits for decode's word: on the Ack it goes on to
decode, on a Nack it is applied here.

Each request goes to the decode worker the router names in its admit (``decode``); a
cancel is planned by the router at a point of the request's own life (``cancel``).

A crash of any rank is the prefill worker's crash (spec ``EnvCrash``): every rank stops
and drops what it holds. When the router restarts the worker, every rank takes the new
incarnation (``restart_self``) with empty pools and joins new pair groups.

Mutant ``release_before_install`` (spec/mutants.py): every rank frees its source
blocks as soon as its chunks are sent, before the Ack. The leader's log states what its
allocator holds after its RankDone (``observed.p``), which is how the checker sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from refimpl.api import State, channels
from refimpl.cluster.control import Message
from refimpl.cluster.ends import held, prefill_end, rank_sender
from refimpl.cluster.link import RAW_TAG, Link, is_link_message, rid_of
from refimpl.cluster.worker import CLOSE_WAIT, Base, WorkerArgs
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
        self.w, self.tx = prefill_end(
            self.spec.model(), a.prefill_tp, a.rank, self.spec.block_size, a.capacity, self.link
        )
        self.reqs: dict[str, PReq] = {}
        self.others = [f"p{r}" for r in range(1, a.prefill_tp)]
        self.down = False  # the prefill worker crashed (one of its ranks): stop until restart
        self.dest: dict[str, str] = {}  # rid -> its decode worker (every rank)
        self.prompts: dict[str, tuple[int, ...]] = {}  # rid -> its prompt (every rank)
        self.offered: dict[str, State] = {}  # rid -> its offer's state when last seen
        self.admits: list[Message] = []  # admitted, not yet prefilled (one per loop turn)
        self.early: dict[str, list[Message]] = {}  # other ranks' "frozen" before our admit
        self.ended: set[str] = set()  # requests this leader is done with

    def route(self, channel: str) -> str:
        """An API channel's process: the request's decode worker, or source rank r."""
        if channel.endswith(">rx"):
            return self.dest.get(rid_of(channel), "d0")
        tail = channel.rpartition(">tx")[2]
        if not tail.isdigit() or int(tail) >= self.a.prefill_tp:
            raise ValueError(f"channel {channel!r} routes to no process of this cluster")
        return f"p{int(tail)}"

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
        try:
            self.offer(r.rid, r.epoch)  # queued: the manifest goes after the handoff
        except (ValueError, OwnershipError) as e:  # its blocks are gone (the mutant)
            self.fail(r, f"offer refused: {e}")
            return
        self.event("PrefillFreeze", r.rid)
        self.ch.send(
            r.decode, "handoff", rid=r.rid, epoch=r.epoch, first=r.first, steps=r.steps,
            cancel_step=r.cancel_step,
        )  # fmt: skip
        r.phase, r.deadline = "await_ready", self.now() + self.a.ready_wait_s
        if r.decode in self.dead:
            r.deadline = 0.0

    def offer(self, rid: str, epoch: int) -> None:
        """This rank's offer of the attempt, every layer computed already."""
        self.end_offer(rid)
        layers = self.w.geometry.num_layers
        self.tx.offer(rid, self.prompts[rid], epoch=epoch, layers=layers, dst_tp=1)
        for layer in range(layers):
            self.tx.send_layer(rid, layer)
        self.offered[rid] = State.OFFERED

    def end_offer(self, rid: str) -> None:
        """This rank's offer of ``rid`` is over (its reply read, or aborted): forget it."""
        if rid not in self.offered:
            return
        self.tx.poll(rid)
        if not self.tx.state(rid).final:
            self.tx.abort(rid, "ended by the prefill leader")
        self.tx.forget(rid)
        del self.offered[rid]

    def poll_offers(self) -> bool:
        """Read the Receiver's replies of every offer: the events of what they did."""
        moved = False
        for rid in list(self.offered):
            was = self.offered[rid]
            moved |= self.tx.poll(rid) > 0
            now = self.offered[rid] = self.tx.state(rid)
            if now is was:
                continue
            if was is State.OFFERED and now is not State.REFUSED:  # Ready came
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
        self.drop_everywhere(r.rid)
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
        why = "; ".join(self.tx.reasons(rid))
        self.tell_others("release", rid=r.rid, epoch=r.epoch)
        self.end_offer(rid)
        if r.cancel_pending:
            self.cancel_here(r)
            return
        if r.epoch >= MAX_ATTEMPTS:
            self.fail(r, f"decode refused {MAX_ATTEMPTS} attempts ({why})")
            return
        r.epoch += 1
        r.phase = "admitted"  # every rank still holds its blocks: offer again at once
        self.maybe_handoff(r)

    def on_release(self, m: Message) -> None:
        self.end_offer(m["rid"])

    def on_drop(self, m: Message) -> None:
        self.admits = [a for a in self.admits if a["rid"] != m["rid"]]
        self.drop(m["rid"])

    def drop(self, rid: str) -> None:
        """The request is over on this rank: its offer, its blocks, its late replies."""
        self.end_offer(rid)
        self.link.fence(channels(rid).to_rank(self.a.rank), VOID)
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
        """The request is over on prefill: its blocks go on every rank, and a later turn
        (an early "frozen" handled in the same admit) finds it ended."""
        self.drop_everywhere(r.rid)
        self.reqs.pop(r.rid, None)
        r.phase = "ended"
        self.ended.add(r.rid)
        self.early.pop(r.rid, None)

    def drop_everywhere(self, rid: str) -> None:
        self.drop(rid)
        self.tell_others("drop", rid=rid)

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
                    why = (
                        f"decode worker {r.decode} died"
                        if r.decode in self.dead
                        else f"no word from decode {r.decode} in {self.a.timeout_s}s"
                    )
                    self.fail(r, f"prefill timeout: {why}")
                    busy = True
        self.link.flush()  # after the events of what was sent are logged
        return busy

    def on_dead(self, who: str) -> None:
        self.dead.add(who)
        if who.startswith("p"):
            # The prefill worker has crashed: its replicas are gone (spec EnvCrash). This
            # rank stops for good and tells the router where its clock stands.
            self.down = True
            for rid in list(self.alloc.holders()):
                self.alloc.free(rid)
            self.tx = rank_sender(self.w, self.a.rank, self.link)  # its offers are gone
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
        """The restarted prefill worker: this rank comes back as incarnation ``inc``, its
        pools empty (on_dead emptied them) and no request of the old one left."""
        self.down = False
        self.link.clear()
        self.dest.clear()
        self.ended.clear()
        self.dead = {w for w in self.dead if not w.startswith("p")}

    def settled(self) -> bool:
        """No request open on the leader, no offer or block on any rank."""
        return not self.reqs and not self.offered and held(self.alloc) == 0
