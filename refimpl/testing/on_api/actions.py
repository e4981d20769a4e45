"""The spec's actions as calls on the API's ends (``ApiActions``, a mixin of ``ApiSubject``).

Each ``_<Action>(i, arg)`` runs one spec action on the real Senders/Receiver (the table
is in ``subject``'s doc); ``_deliver`` hands a message in flight to its end. The step
raises ``ApiRefusal`` (not enabled) when the scheduler or the transport cannot take it.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.api import KVGeometry, Receiver, Sender
from refimpl.api.abstract import TIMEOUT_REASON
from refimpl.api.wire import CHUNK, State
from refimpl.engine.data import RankPools
from refimpl.errors import OwnershipError
from refimpl.testing.ghost import Ghost
from refimpl.testing.on_api.views import view
from refimpl.testing.on_api.wire import Logical, SpecTransport
from spec.actions_env import _lost_with_decode, _lost_with_prefill
from spec.config import Config
from spec.manifest import check_compatible
from spec.manifest import from_json_dict as manifest_from_json
from spec.state import (
    CANCELLED,
    FAILED,
    FINISHED,
    G_END_CANCELLED,
    G_END_FAILED,
    PREEMPTED,
    PREFILLING,
    QUEUED,
    RUNNING,
    World,
)
from spec.steps import RECEIVES

LAYERS, BLOCK = 2, 2


class ApiRefusal(Exception):
    """The scheduler or the transport cannot take the step (``prop``: None, not enabled)."""

    def __init__(self, message: str, prop: str | None = None) -> None:
        super().__init__(message)
        self.prop = prop


LIVE = (QUEUED, PREFILLING, RUNNING, PREEMPTED)
ENDED = {FINISHED: "finished", CANCELLED: "cancelled", FAILED: "failed"}  # the reason told
MESSAGE_ACTIONS = RECEIVES  # the actions that consume a message sent to a worker


class ApiActions:
    """The action methods; the state is ``ApiSubject``'s."""

    c: Config
    n: int
    tx: list[Sender]
    pp: list[RankPools]
    rx: Receiver  # or its proxy (on_api.remote)
    dp: RankPools
    tag: str  # the request ids' prefix (unique per run across processes)
    gp: KVGeometry
    gd: KVGeometry
    net: SpecTransport
    model: Ghost
    st: list[int]
    ep: list[int]
    g: list[int]
    tokens: list[int]
    frozen: list[dict[int, int]]
    faults: int
    p_up: bool
    d_up: bool
    dead_dep: list[int]
    offered: dict[tuple[str, int], int]

    def rid(self, i: int) -> str:
        return f"{self.tag}r{i}"

    def token_ids(self) -> list[int]:
        return list(range(self.c.blocks * BLOCK))

    def bad_manifest(self, mf: dict[str, Any]) -> bool:
        try:
            return not check_compatible(manifest_from_json(mf), self.rx.local).ok
        except Exception:
            return True

    def abstract(self) -> World:
        raise NotImplementedError  # ``ApiSubject.abstract``

    def from_source(self, kv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # ``ApiSubject.from_source``

    def sender_view(self, i: int) -> dict[str, int]:
        raise NotImplementedError  # ``ApiSubject.sender_view``

    def tier_busy(self, i: int) -> None:
        """Refuses a write or a free of the device copy while a move holds it
        (``on_api/worlds/offload.py``)."""

    def host_free(self, i: int) -> bool:
        return True  # no host copy and no move (``on_api/worlds/offload.py``)

    def cache_hit(self, i: int) -> bool:
        """The shared host cache holds the prompt: it is loaded, not computed
        (``on_api/worlds/host_cache.py``)."""
        return False

    def prefix_hit(self, i: int) -> int:
        """Prefix blocks decode holds for request i's offer (``on_api/worlds/prefix.py``)."""
        return 0

    def lend_prefix(self, i: int, hit: int) -> None:
        """Decode's scheduler lends the offer its cached prefix (``worlds/prefix.py``)."""

    def crash_prefix(self) -> None:
        """The decode process's prefix cache is gone (``on_api/worlds/prefix.py``)."""

    def quiesce_tier(self, i: int) -> None:
        """An ended request's moves stop and its host copy goes (``worlds/offload.py``)."""

    def crash_tier(self) -> None:
        """The prefill process's host memory is gone (``on_api/worlds/offload.py``)."""

    def restart_tier(self) -> None:
        """The restarted prefill process opens its tier again (``worlds/disk_offload.py``)."""

    def _message(self, i: int, code: int) -> Logical:
        lm = self.net.find(self.rid(i), code, self.c.blocks, self.bad_manifest)
        if lm is None:
            raise ApiRefusal(f"no such message in flight for {self.rid(i)}")
        return lm

    def _deliver(self, i: int, code: int, name: str = "") -> None:
        """Hand the message to its end. The scheduler's own part (the request's status is
        the router's, which the Senders do not see): a reply for an ended request is
        dropped unread (``PrefillDiscard``); the Receiver has heard of the end
        (``tell_ends``) and refuses a manifest for it by itself (``DecodeReject``)."""
        if name == "PrefillResume" and self.p_up and self.sender_view(i).get("nack") == code:
            for s in self.tx:  # read early (``early_nack``): its writes have landed now
                s.poll(self.rid(i))
            return
        lm = self._message(i, code)
        up = self.d_up if lm.to_d else self.p_up
        if not up:
            raise ApiRefusal("its receiver is down")
        rid, ended = self.rid(i), self.st[i] in ENDED
        self.net.deliver(lm)
        if lm.to_d:
            self.rx.poll(rid)
        elif name == "PrefillDiscard" and ended:
            for ch, _, _ in lm.copies:
                self.net.poll(ch)
        else:
            for s in self.tx:
                s.poll(rid)
            self.after_reply(i, name)

    def early_nack(self, i: int, code: int) -> bool:
        """The environment delivers the Nack ``code`` to the Senders while writes of its
        attempt are still in flight (delivery order is free): a stutter, the spec's Nack
        stays unconsumed (a Sender reads it and waits: ``sender_part``'s ``nack``) until
        ``PrefillResume`` once they landed (``on_api.tour``). False if read already."""
        if self.p_up and self.sender_view(i).get("nack") == code:
            return False
        lm = self._message(i, code)
        self._need(self.p_up and not lm.to_d, "not a reply to a live prefill")
        self.net.deliver(lm)
        for s in self.tx:
            s.poll(self.rid(i))
        return True

    def early_abort(self, i: int, reason: str) -> bool:
        """The engine aborts request ``i``'s attempt while writes of it are in flight (its
        clock is free): a stutter, the Senders keep the attempt and its pins, and say
        nothing, until ``PrefillTimeout``/``PrefillQuiesce`` once they landed
        (``on_api.early``). True: given."""
        self._need(self.p_up and self._live(i), "no attempt in progress")
        for s in self.tx:
            s.abort(self.rid(i), reason)
        return True

    def after_reply(self, i: int, name: str) -> None:
        """The scheduler's part after a reply reached the Senders (on_api/worlds/streamed.py)."""

    def tell_ends(self) -> None:
        """The router tells the Receiver of every request it has ended (``Receiver.end``):
        no verify or commit of it from now on, and its manifest is refused at intake."""
        if self.d_up:
            for i in range(self.n):
                if self.st[i] in ENDED:
                    self.rx.end(self.rid(i), ENDED[self.st[i]])

    def _need(self, ok: bool, why: str, prop: str | None = None) -> None:
        if not ok:
            raise ApiRefusal(why, prop)

    def _PrefillAdmit(self, i: int, arg: int) -> None:
        self._need(self.p_up and self.st[i] in (QUEUED, PREEMPTED), "not queued")
        rid = self.rid(i)
        self._need(not self.pp[0].alloc.blocks_of(rid), "holds blocks")
        self._need(self.host_free(i), "a host copy is reloaded instead")
        self._need(not self.cache_hit(i), "a host-cache hit is loaded instead")
        for p in self.pp:  # the first refuses (CapacityError) before any allocates
            p.alloc.allocate(rid, self.c.blocks)
        self.st[i] = PREFILLING

    def _write(self, pools: Any, rid: str, blocks: Any, tokens: int, i: int, rank: int) -> None:
        full = self.model.content(i, tokens)
        g = self.gp if pools in self.pp else self.gd
        if pools in self.pp:
            h = g.kv_heads_per_rank
            full = full[:, :, :, rank * h : (rank + 1) * h]
        pools.write_full(rid, list(blocks), full)

    def _PrefillRun(self, i: int, arg: int) -> None:
        self._need(self.p_up and self.st[i] == PREFILLING, "not prefilling")
        rid = self.rid(i)
        for r, p in enumerate(self.pp):  # a preempted request's KV computed again, whole
            self._write(p, rid, p.alloc.blocks_of(rid), self.tokens[i], i, r)
        self.st[i] = RUNNING

    def _live(self, i: int) -> bool:
        return self.sender_view(i)["live"] == 1

    def _PrefillDecodeStep(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.p_up and self.st[i] == RUNNING, "not running")
        self.tier_busy(i)
        if self._live(i):  # the scheduler reads the Sender: an attempt reads these blocks
            raise OwnershipError(f"{rid}: an attempt is in progress", prop="FrozenSnapshot")
        self._need(bool(self.pp[0].alloc.blocks_of(rid)), "no prefill replica")
        for r, p in enumerate(self.pp):
            self._write(p, rid, p.alloc.blocks_of(rid), self.tokens[i] + 1, i, r)
        self.tokens[i] += 1

    def _PrefillFinish(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.p_up and self.st[i] == RUNNING and not self._live(i), "not finishable")
        self._need(self.host_free(i), "a host copy or a move")
        self._need(bool(self.pp[0].alloc.blocks_of(rid)), "no prefill replica")
        for p in self.pp:
            p.alloc.free(rid)
        self.st[i] = FINISHED

    def _PrefillFreeze(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.p_up and self.st[i] == RUNNING and not self._live(i), "not freezable")
        self._need(self.ep[i] < self.c.max_attempts, "no attempt left")
        self._need(self.host_free(i), "a host copy or a move")
        e = self.ep[i] + 1  # one epoch for every rank, chosen once
        hit = self.prefix_hit(i)  # decode's cached prefix, lent to the request: not sent
        self.lend_prefix(i, hit)
        for s, p in zip(self.tx, self.pp, strict=True):
            m = s.offer(
                rid,
                self.token_ids(),
                blocks=p.alloc.blocks_of(rid),
                epoch=e,
                dst_tp=self.c.dst_tp,
                layers=LAYERS,
                free_source=True,
                prefix_blocks=hit,
            )
            self.offered[(rid, e)] = m.prefix_blocks  # the manifest's: its messages' hit
        for layer in range(0 if self.c.layers else LAYERS):  # streamed: PrefillSendLayer
            for s in self.tx:
                s.send_layer(rid, layer)
        self.ep[i] = e
        self.frozen[i][e] = self.tokens[i]

    def _end_prefill(self, i: int, reason: str) -> None:
        rid = self.rid(i)
        for s in self.tx:
            s.abort(rid, reason)
        for p in self.pp:
            p.alloc.free(rid)

    def _PrefillTimeout(self, i: int, arg: int) -> None:
        self._need(self.p_up and self._live(i), "no attempt in progress")
        self._end_prefill(i, "timeout")
        if self.st[i] == RUNNING:
            self.st[i], self.g[i] = FAILED, self.g[i] | G_END_FAILED

    def _PrefillQuiesce(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.p_up and self.st[i] in (FINISHED, CANCELLED, FAILED), "not ended")
        held = bool(self.pp[0].alloc.blocks_of(rid)) or not self.host_free(i)
        self._need(held or self._live(i), "nothing held")
        self.quiesce_tier(i)
        self._end_prefill(i, "cancelled")

    def _DecodeStep(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.d_up and self.st[i] == RUNNING and self._committed(i), "not decoding")
        kv = self.from_source(self.model.content(i, self.tokens[i] + 1))
        blocks = self.rx.result(rid).blocks  # its own: a prefix is lent, read-only
        hit = self.offered.get((rid, view(self.rx, "attempt_epoch", rid)), 0)
        own = hit * BLOCK // self.gd.block_size  # (the manifest's prefix, in decode blocks)
        self.dp.write_full(rid, blocks[own:], kv[own:])
        self.tokens[i] += 1

    def _committed(self, i: int) -> bool:
        rid = self.rid(i)
        return self.rx.state(rid) is State.DONE and bool(self.dp.alloc.blocks_of(rid))

    def _DecodeFinish(self, i: int, arg: int) -> None:
        self._need(self.d_up and self.st[i] == RUNNING and self._committed(i), "not decoding")
        self.dp.alloc.free(self.rid(i))
        self.st[i] = FINISHED

    def _DecodeAbort(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        self._need(self.d_up and self.st[i] != RUNNING, "a running request is not aborted")
        if self._committed(i):
            self.dp.alloc.free(rid)
            return
        self._need(not self.rx.state(rid).final, "no attempt")
        self.rx.abort(rid, "cancelled")

    def _DecodeAbortFenced(self, i: int, arg: int) -> None:
        self._DecodeAbort(i, arg)  # the API's abort on its revocable transport: fenced

    def _DecodeTimeout(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        held = self.d_up and view(self.rx, "quarantined", rid)  # the longer, second timer
        self._need(self.d_up and (held or not self.rx.state(rid).final), "no attempt")
        self._need(self.rx.state(rid) is not State.WAITING, "no attempt")
        self.rx.abort(rid, TIMEOUT_REASON)

    def _fault(self, i: int, code: int, op: str) -> None:
        self._need(self.faults < self.c.faults, "no fault left")
        getattr(self.net, op)(self._message(i, code))
        self.faults += 1

    def _EnvLose(self, i: int, arg: int) -> None:
        self._fault(i, arg, "lose")

    def _EnvDuplicate(self, i: int, arg: int) -> None:
        self._need(self._message(i, arg).group[0] != CHUNK, "a write is not duplicated")
        self._fault(i, arg, "duplicate")

    def _EnvCorrupt(self, i: int, arg: int) -> None:
        self._fault(i, arg, "corrupt")

    def _EnvManifestMismatch(self, i: int, arg: int) -> None:
        self._fault(i, arg, "mismatch")

    def _EnvCrash(self, i: int, worker: int) -> None:
        self._need(self.faults < self.c.faults, "no fault left")
        before = self.abstract()
        if worker == 0 and self.p_up:
            for s in self.tx:
                s.crash()
            self.net.drop(lambda lm: lm.to_d and lm.group[0] != CHUNK)
            self.p_up = False
            self.crash_tier()
            fate = [_lost_with_prefill(r) for r in before.reqs]
        elif worker == 1 and self.d_up:
            self.dead_dep = [r.dep for r in before.reqs]
            self.rx.crash()
            self.crash_prefix()
            self.net.drop(lambda lm: not lm.to_d)
            self.d_up = False
            fate = [_lost_with_decode(r._replace(d=0), r.d) for r in before.reqs]
        else:
            raise ApiRefusal("that worker is down")
        self.faults += 1
        for k, r in enumerate(fate):  # the router's crash fate: the spec's
            self.st[k], self.g[k] = r.st, r.g

    def _ClientCancel(self, i: int, arg: int) -> None:
        self._need(self.c.cancel and self.st[i] in LIVE, "ended")
        self.st[i], self.g[i] = CANCELLED, self.g[i] | G_END_CANCELLED

    # ------------------------------------------------------------ the refinement map
