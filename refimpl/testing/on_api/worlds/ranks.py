"""Decode ranks on the API (``Config.decode_ranks``, spec/behaviours/decode_ranks.py):
``RankSubject``, the subject on ``refimpl.api.ranks``' per-rank ends.

Each prefill TP rank is a ``RankSender`` and each decode TP rank a ``RankReceiver`` of
its own heads (one sub-handoff per decode rank, ``ranks.sub_id``); one ``Epochs`` (the
router's) chooses each attempt's epoch. The spec's decode is one worker of ``dst_tp``
ranks, its prefill one of ``src_tp``:

    a spec message        every sub-handoff's copy of it sent in one step, with the
                          rank group's messages across the sides of that step
                          (``on_api.wire``); delivered to every rank it names, then each
                          rank of that side polls, in an order that alternates step by
                          step (``in_turn``)
    the group's messages  between the ranks of one side: inside the spec's one worker,
                          there at once; after every step each rank polls until no
                          group message is left (``settle``)
    DecodeValidate, DecodeRankInstall, DecodeCommit   eager (``on_api.tour.EAGER``):
                          each rank commits its sub-handoff once its chunks and seals
                          landed (its install) and says so; the request is ready only
                          once every rank did (``RankReceiver.ready``: the commit)
    DecodeAbort(Fenced)   the scheduler's cancel on decode rank 0 (the group tells the
                          others); DecodeTimeout: the own timer of the first rank still
                          receiving; DecodeFail: that rank's load failed
                          (``RankReceiver.fail``)
    EnvCrash              every rank of that side crashes (``RankSender.crash`` /
                          ``RankReceiver.crash``: its pools reset), as ``ApiSubject``'s
    EnvManifestMismatch   every sub-handoff's manifest names another model

    EnvRestart            every rank of the crashed side anew over its reset pools,
                          ``RankSender/RankReceiver(incarnation=k)``, every rank of the
                          other side told (``peer_restarted``: a fence of the dead
                          incarnation's messages, per prefill rank on the decode ranks)

Prefill TP > 1 and the refinement map: ``on_api/worlds/rank_map.py``; streamed layer by
layer (every prefill rank's ``send_layer``, every decode rank asked ``layer_ready``):
``on_api/worlds/rank_stream.py``. Not mapped (``adapter.UNEXPRESSED``): decode across
processes.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.api import KVGeometry, Receiver
from refimpl.api.abstract import TIMEOUT_REASON
from refimpl.api.ranks import Epochs, RankReceiver, RankSender, sub_id
from refimpl.api.wire import State
from refimpl.testing.on_api.actions import BLOCK, ENDED, LAYERS
from refimpl.testing.on_api.subject import MODEL, ApiSubject, decode_geometry
from refimpl.testing.on_api.wire import SpecTransport
from refimpl.testing.on_api.worlds.failure import FAIL_REASON
from refimpl.testing.on_api.worlds.rank_map import RankMap
from refimpl.testing.on_api.worlds.rank_stream import RankStream
from spec.config import Config
from spec.state import FINISHED, RUNNING

__all__ = ["RankSubject", "group_side", "rank_channel"]

SETTLE = 16  # rounds of polls after a step, at most (each round: every rank of both sides)


def group_side(channel: str) -> str | None:
    """The side ("p"/"d") of a rank group's channel (``ranks.group_channel``), else None."""
    tail = channel.rpartition(">")[2]
    return tail[0] if tail[:1] in ("p", "d") and tail[1:].isdigit() else None


def rank_channel(channel: str) -> tuple[str, bool]:
    """(request id, to decode?) of a sub-handoff's or a group's channel."""
    head, _, tail = channel.rpartition(">")
    rid = head[3:]
    side = group_side(channel)
    if side is not None:
        return rid, side == "d"
    return rid.rpartition("@")[0] or rid, tail == "rx"


class RankSubject(RankMap, RankStream, ApiSubject):
    """The subject of a decode-ranks world (see the module doc)."""

    def __init__(
        self, c: Config, seed: int, *, mutants: frozenset[str] = frozenset(), **kw: Any
    ) -> None:
        from refimpl.api.switches import RANK_RECEIVER_SWITCHES, RANK_SENDER_SWITCHES

        rank_switches = RANK_RECEIVER_SWITCHES | RANK_SENDER_SWITCHES
        if other := sorted(mutants - rank_switches):
            raise ValueError(
                f"{c.name}: the switches {other} are not mapped with decode ranks; "
                f"these are: {sorted(rank_switches)}"
            )
        self.epochs = Epochs()  # the router's: one epoch per attempt, for every rank
        self.rx_rank_mutants = mutants & RANK_RECEIVER_SWITCHES
        self.tx_rank_mutants = mutants & RANK_SENDER_SWITCHES
        super().__init__(c, seed, **kw)
        self.ptx = self.rank_senders(0)

    def rank_senders(self, incarnation: int) -> list[RankSender]:
        """One RankSender per prefill rank over its pools (empty after a crash)."""
        return [
            RankSender(
                p,
                self.gp,
                self.net,
                MODEL,
                rank=r,
                dst_tp=self.c.dst_tp,
                epochs=self.epochs,
                incarnation=incarnation,
                mutants=self.tx_rank_mutants,
                blocks_per_chunk=1,
            )
            for r, p in enumerate(self.pp)
        ]

    def rank_receivers(self, incarnation: int) -> list[RankReceiver]:
        """One RankReceiver per decode rank over its pools (empty after a crash)."""
        return [
            RankReceiver(
                self.dps[d],
                self.gd,
                self.net,
                MODEL,
                rank=d,
                src_tp=self.c.src_tp,
                incarnation=incarnation,
                stage=self.stage,
                mutants=self.rx_rank_mutants,
            )
            for d in range(self.c.dst_tp)
        ]

    def senders(self, incarnation: int) -> list[Any]:
        return []  # no Sender of the whole request: the RankSenders' sub-handoffs

    def transport(self) -> SpecTransport:
        return SpecTransport(
            rank_channel, group_side, rank_of=self.prefill_rank, dst_ranks=self.c.dst_tp
        )

    def decode_side(
        self, stage: bool, dst_block: int, rx_kw: dict[str, Any]
    ) -> tuple[KVGeometry, Any, Receiver]:
        c = self.c
        gd = decode_geometry(c, dst_block)
        per_req = gd.blocks_for(c.blocks * BLOCK)
        cap = max(1, c.cap_d // c.blocks) * per_req
        self.dps = [gd.make_rank_pools(d, cap) for d in range(c.dst_tp)]
        self.gd = gd
        self.rxs: list[RankReceiver] = self.rank_receivers(0)
        return gd, self.dps[0], self.rxs[0].rx  # rank 0's (what reads one Receiver)

    # ------------------------------------------------------------ steps
    def step(self, name: str, args: dict[str, Any]) -> None:
        super().step(name, args)
        self.settle()

    def settle(self) -> None:
        """Every rank hears its group (inside the spec's worker) until none is left."""
        for _ in range(SETTLE):
            heard = 0
            for i in range(self.n):
                rid = self.rid(i)
                heard += sum(s.poll(rid) for s in self.in_turn(self.ptx)) if self.p_up else 0
                heard += sum(r.poll(rid) for r in self.in_turn(self.rxs)) if self.d_up else 0
            if not heard and not self.net.flush():  # the step's group messages left
                return
        raise AssertionError(f"the rank groups still talk after {SETTLE} rounds of polls")

    def in_turn(self, ranks: list[Any]) -> list[Any]:
        """The order the ranks of one side poll in: last rank first on an even step,
        first rank first on an odd one (inside one spec worker the order is free, so
        the walks take both: a rank may commit its part before or after it hears a
        sibling's abort)."""
        return ranks if self.net.tick % 2 else ranks[::-1]

    def _deliver(self, i: int, code: int, name: str = "") -> None:
        lm = self._message(i, code)
        self._need(self.d_up if lm.to_d else self.p_up, "its receiver is down")
        rid = self.rid(i)
        self.net.deliver(lm)
        if lm.to_d:
            for r in self.in_turn(self.rxs):
                r.poll(rid)
        elif name == "PrefillDiscard" and self.st[i] in ENDED:
            for ch, _, _ in lm.copies:  # a reply for an ended request: dropped unread
                self.net.poll(ch)
        else:
            for s in self.in_turn(self.ptx):
                s.poll(rid)
            self.after_reply(i, name)
            if all(rid in s._g and s.state(rid) is State.DONE for s in self.ptx):  # noqa: SLF001
                for p in self.pp:  # the handoff is done: the scheduler frees the source
                    p.alloc.free(rid)

    def tell_ends(self) -> None:
        if self.d_up:
            for i in range(self.n):
                if self.st[i] in ENDED:
                    for r in self.rxs:
                        r.end(self.rid(i), ENDED[self.st[i]])

    def _PrefillFreeze(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.p_up and self.st[i] == RUNNING and not self._live(i), "not freezable")
        self._need(self.ep[i] < self.c.max_attempts, "no attempt left")
        e = self.epochs.open(rid)  # the router opens the attempt, once for every rank
        if e != self.ep[i] + 1:
            raise AssertionError(f"{rid}: Epochs opened {e}, the router's next is {self.ep[i] + 1}")
        for s, p in zip(self.ptx, self.pp, strict=True):
            s.offer(rid, self.token_ids(), blocks=p.alloc.blocks_of(rid))
        for layer in range(0 if self.c.layers else LAYERS):  # streamed: PrefillSendLayer
            for s in self.ptx:
                s.send_layer(rid, layer)
        self.ep[i] = e
        self.frozen[i][e] = self.tokens[i]

    def _EnvCrash(self, i: int, worker: int) -> None:
        """A worker's crash: every rank of its side (``RankSender.crash`` /
        ``RankReceiver.crash``), then as ``ApiSubject``'s (messages dropped, the
        router's crash fate)."""
        p_up, d_up = self.p_up, self.d_up
        super()._EnvCrash(i, worker)
        for end in (self.ptx if p_up and not self.p_up else []) + (
            self.rxs if d_up and not self.d_up else []
        ):
            end.crash()

    def _EnvRestart(self, i: int, worker: int) -> None:
        """A crashed worker comes back: every rank of its side a new end over its (reset)
        pools with the next incarnation, ``RankSender/RankReceiver(incarnation=k)``, and
        every rank of the other side told by the engine's membership
        (``peer_restarted``), as ``RestartActions._EnvRestart`` does for one end."""
        self._need(self.p_inc + self.d_inc < self.c.restarts, "no restart left")
        if worker == 0 and not self.p_up:
            self.p_inc += 1
            self.ptx = self.rank_senders(self.p_inc)
            self.p_up = True
            for r in self.rxs if self.d_up else []:
                for p in range(self.c.src_tp):
                    r.peer_restarted("p", p, self.p_inc)
        elif worker == 1 and not self.d_up:
            self.d_inc += 1
            self.rxs = self.rank_receivers(self.d_inc)
            self.rx = self.rxs[0].rx  # what reads one Receiver (a manifest's check)
            self.d_up = True
            for s in self.ptx if self.p_up else []:
                for d in range(self.c.dst_tp):
                    s.peer_restarted("d", d, self.d_inc)
        else:
            self._need(False, "that worker is up")

    def _end_prefill(self, i: int, reason: str) -> None:
        rid = self.rid(i)
        for s in self.ptx:
            s.abort(rid, reason)
        for p in self.pp:
            p.alloc.free(rid)

    def _committed(self, i: int) -> bool:
        rid = self.rid(i)
        return all(r.ready(rid) for r in self.rxs) and all(
            p.alloc.blocks_of(sub_id(rid, d)) for d, p in enumerate(self.dps)
        )

    def _DecodeStep(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.d_up and self.st[i] == RUNNING and self._committed(i), "not decoding")
        kv = self.from_source(self.model.content(i, self.tokens[i] + 1))
        h = kv.shape[3] // len(self.rxs)
        for d, (r, p) in enumerate(zip(self.rxs, self.dps, strict=True)):
            p.write_full(sub_id(rid, d), r.blocks(rid), kv[:, :, :, d * h : (d + 1) * h])
        self.tokens[i] += 1

    def _DecodeFinish(self, i: int, arg: int) -> None:
        self._need(self.d_up and self.st[i] == RUNNING and self._committed(i), "not decoding")
        rid = self.rid(i)
        for d, p in enumerate(self.dps):
            p.alloc.free(sub_id(rid, d))
        self.st[i] = FINISHED

    def _receiving(self, i: int) -> bool:
        """Some rank's sub-handoff has an attempt in progress (the scheduler's view)."""
        return self.receiving_rank(i) is not None

    def receiving_rank(self, i: int) -> RankReceiver | None:
        """The first decode rank whose sub-handoff is still receiving (prefill TP > 1:
        a rank may have committed its part while another's chunks are still out)."""
        rid = self.rid(i)
        for d, r in enumerate(self.rxs):
            if r.rx.state(sub_id(rid, d)) is State.RECEIVING:
                return r
        return None

    def _DecodeAbort(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.d_up and self.st[i] != RUNNING, "a running request is not aborted")
        if self._committed(i):
            for d, p in enumerate(self.dps):
                p.alloc.free(sub_id(rid, d))
            return
        self._need(self._receiving(i), "no attempt")
        self.rxs[0].abort(rid, "cancelled")  # the group tells the other ranks

    def _DecodeTimeout(self, i: int, arg: int) -> None:
        r = self.receiving_rank(i) if self.d_up else None
        self._need(r is not None, "no attempt")
        assert r is not None
        r.rx.abort(sub_id(self.rid(i), r.rank), TIMEOUT_REASON)  # that rank's own timer
        r.poll(self.rid(i))

    def _DecodeFail(self, i: int, arg: int) -> None:
        r = self.receiving_rank(i) if self.c.decode_failure and self.d_up else None
        self._need(r is not None, "no attempt being received")
        assert r is not None
        r.fail(self.rid(i), FAIL_REASON)  # the load of a rank still receiving failed

    def check_integrity(self) -> None:
        super().check_integrity()
        problems = []
        for p in self.dps:
            p.alloc.check_integrity()
        for i in range(self.n):
            rid = self.rid(i)
            held = {len(p.alloc.blocks_of(sub_id(rid, d))) for d, p in enumerate(self.dps)}
            if len(held) > 1:
                problems.append(f"{rid}: the decode ranks hold {sorted(held)} blocks")
        if problems:
            raise AssertionError("; ".join(problems))

    def replica(self, i: int, where: str) -> torch.Tensor | None:
        if where != "d":
            return super().replica(i, where)
        if not self._committed(i):
            return None
        rid = self.rid(i)
        kv = [
            self.to_source(p.gather(r.blocks(rid))) for r, p in zip(self.rxs, self.dps, strict=True)
        ]
        return torch.cat(kv, dim=3)

    def data_problems(self) -> list[str]:
        """NoPartialUse per decode rank: a layer its Receiver reports ready holds, in the
        blocks it names, that rank's heads of the attempt's bytes."""
        out = []
        for i in range(self.n):
            rid = self.rid(i)
            for d, (r, p) in enumerate(zip(self.rxs, self.dps, strict=True)):
                sid = sub_id(rid, d)
                blocks = r.rx.held().get(sid) if self.d_up else None
                a = r.rx._att.get(sid)  # noqa: SLF001 - the attempt's epoch, read only
                if blocks is None or a is None:
                    continue
                want = self.model.content(i, self.frozen[i].get(a.m.epoch, self.tokens[i]))
                h = want.shape[3] // len(self.rxs)
                got = self.to_source(p.gather(list(blocks)))
                for layer in range(LAYERS):
                    mine = want[:, layer, :, d * h : (d + 1) * h]
                    if r.rx.layer_ready(sid, layer) and not torch.equal(got[:, layer], mine):
                        out.append(f"{sid} (decode rank {d}) layer {layer} ready, not its heads")
        return out

    def snapshot(self) -> object:
        groups = repr(
            [
                sorted((k, g.state.value, g.epoch) for k, g in e._g.items())  # noqa: SLF001
                for e in [*self.ptx, *self.rxs]
            ]
        )
        pools = tuple(
            (
                repr(p.alloc.counts()),
                tuple(p.alloc.holders()),
                p.gather(range(p.alloc.capacity)).sum(),
            )
            for p in self.dps
        )
        subs = repr(
            [
                [(k, o.state, o.epoch) for k, o in s._subs[d][0]._offers.items()]  # noqa: SLF001
                for s in self.ptx
                for d in s._subs
            ]
        )
        ends = repr([[(k, a.state.value) for k, a in r.rx._att.items()] for r in self.rxs])  # noqa: SLF001
        return (super().snapshot(), groups, pools, subs, ends)

    def held_blocks(self) -> dict[str, int]:
        copies = sum(len(b) for s in self.ptx for b in s.held().values())
        return {
            "P": sum(p.alloc.capacity - p.alloc.num_free for p in self.pp) + copies,
            "D": sum(p.alloc.capacity - p.alloc.num_free for p in self.dps),
        }
