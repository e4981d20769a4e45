"""The public API (``refimpl.api``) as a ``harness.Adapter``: spec actions run as calls on
real ``Sender`` objects (one per prefill TP rank, ``Sender(..., rank=r)``, each offering
layer by layer) and a ``Receiver``, over ``api_wire.SpecTransport``.

What runs where:

    PrefillAdmit/Run/DecodeStep/Finish, DecodeStep/Finish, ClientCancel
                    the engine author's scheduler around the API (this module): blocks
                    from each rank's allocator, the model's KV written (``Ghost.content``)
    PrefillFreeze   every rank's ``offer(..., layers=L, epoch=e)`` (one epoch chosen once
                    for all ranks), then ``send_layer`` of every layer
    a message action  ``SpecTransport.deliver`` that message, then the side's ``poll``:
                    which spec action consumes it is the end's own decision, and the
                    refinement map says whether it was the spec's
    PrefillTimeout / PrefillQuiesce   every rank's ``Sender.abort`` (then the blocks go;
                    unrevocable worlds: given early while writes were in flight, the
                    Senders waited, ``on_api.early``, and this abort ends it)
    DecodeAbortFenced / DecodeTimeout   ``Receiver.abort`` (a committed copy: the blocks go;
                    ``DecodeAbort``'s quarantine is the spec's alternative, ``declined``;
                    unrevocable worlds: ``DecodeAbort``, the Receiver quarantines, and a
                    second ``abort`` is the quarantine's longer timer: ``api.unrevocable``)
    DecodeReclaim   the Senders' aborts (Quiesced, every rank's) delivered: it is over
    PrefillResume   the Nack delivered (or, read early while writes were in flight, the
                    Senders polled once they landed: ``early_nack``), then Quiesced
    EnvLose/Duplicate/Corrupt/ManifestMismatch   the transport's fault on that message
    DecodeEvictPrefix   the decode engine's prefix cache drops its blocks; the prefix is
                    lent to an offer at PrefillFreeze (``Receiver.expect(prefix=...)``,
                    ``offer(prefix_blocks=)``): ``on_api/worlds/prefix.py``
    EnvRestart      new Senders / a new Receiver with the next incarnation, the peer
                    told (``peer_restarted``): ``on_api/worlds/restarts.py``
    EnvCrash        ``Sender.crash`` on every rank / ``Receiver.crash``; the messages to
                    the dead worker (and its writes) are gone
    DecodeFail      ``Receiver.fail``: the engine's own failure of the attempt being
                    received (``on_api/worlds/failure.py``; its abort is eager)

The API does some spec steps inside one call (``api_tour.EAGER``: a Sender sends every
chunk and seal on Ready; a Receiver verifies and commits once complete, and aborts at
once on a corrupt chunk); the tour drives the spec closed under them. The router's
status on a crash is the spec's crash fate (the router is not the API under test).
``UNEXPRESSED`` names every feature whose actions the API cannot run, with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.api import KVGeometry, ModelIdentity, Receiver
from refimpl.api.abstract import prefill_replica, sender_part
from refimpl.api.wire import channels
from refimpl.testing.ghost import Ghost
from refimpl.testing.on_api.actions import BLOCK, LAYERS, MESSAGE_ACTIONS, ApiRefusal
from refimpl.testing.on_api.views import view
from refimpl.testing.on_api.wire import Logical, SpecTransport
from refimpl.testing.on_api.worlds import (
    DiskOffloadActions,
    FailureActions,
    HostCacheActions,
    PrefixActions,
    RecomputeActions,
    RestartActions,
    StreamedActions,
)
from spec.actions import decode_args
from spec.config import Config
from spec.manifest import RopeConfig
from spec.state import COMPLETE, IDLE, QUEUED, Req, World

__all__ = ["ApiSubject"]

MODEL = ModelIdentity("kvown-tour", RopeConfig(10000.0, 4))
HEAD_DIM = 4


class ApiSubject(
    HostCacheActions,
    PrefixActions,
    DiskOffloadActions,
    RecomputeActions,
    FailureActions,
    StreamedActions,
    RestartActions,
):
    """Real Senders and a Receiver in lockstep with the spec (``harness.Subject``)."""

    def __init__(
        self,
        c: Config,
        seed: int,
        *,
        stage: bool = False,
        dst_block: int = BLOCK,
        mutants: frozenset[str] = frozenset(),
        remote: Any = None,
        disk: bool = False,
    ) -> None:
        """``dst_block``: decode's block size (another than prefill's: the Receiver lands
        in staging and reshards); ``stage``: it stages even at one block size;
        ``remote``: an ``on_api.remote.RemoteDecode``, the decode side in its own process;
        ``disk``: offload to a ``DiskTier`` (``on_api/worlds/disk_offload.py``), not to
        host pools."""
        self.c, self.seed, self.n, self.disk = c, seed, c.n_reqs, disk
        heads = max(2, c.src_tp, c.dst_tp)
        self.gp = KVGeometry(LAYERS, heads, HEAD_DIM, BLOCK, "float32", tp=c.src_tp)
        self.net = self.transport()
        self.net.alive = lambda to_d: self.d_up if to_d else self.p_up
        self.pp = [self.gp.make_rank_pools(r, c.cap_p) for r in range(c.src_tp)]
        self.tx_kw, self.rx_kw = tx_kw, rx_kw = _switches(mutants)
        self.stage, self.remote = stage, remote
        self.restart_init(self.n)  # incarnations 0 (on_api/worlds/restarts.py)
        self.tx = self.senders(0)
        if remote is None:
            self.tag = ""
            self.gd, self.dp, self.rx = self.decode_side(stage, dst_block, rx_kw)
        else:  # the same end, built in the decode process; proxies here
            end = remote.decode(c, self.net, stage, dst_block, rx_kw)
            self.tag, self.gd, self.dp, self.rx = end
        self.model = self.ghost()  # the model's forward pass: the KV a request computes
        self.prefix_init()  # decode's prefix cache (on_api/worlds/prefix.py)
        self.st, self.ep, self.g = [QUEUED] * self.n, [0] * self.n, [0] * self.n
        self.tokens = [0] * self.n
        self.frozen: list[dict[int, int]] = [{} for _ in range(self.n)]
        self.faults, self.p_up, self.d_up = 0, True, True
        self.dead_dep = [0] * self.n  # decode's epochs when it crashed (the spec keeps dep)
        self.stream_init(self.n)  # the streamed worlds' registers (on_api/worlds/streamed.py)
        self.offload_init(self.n)  # the host tier (on_api/worlds/offload.py)
        self.tier_mutants = _tier_switches(mutants)
        self.disk_init()  # the DiskTier offload target (on_api/worlds/disk_offload.py)
        self.host_cache_init(self.n)  # the shared host cache (on_api/worlds/host_cache.py)

    def transport(self) -> SpecTransport:
        """The transport the spec schedules, naming each channel's request and side."""
        return SpecTransport(_rid_of, revocable=self.c.revocable)

    def decode_side(
        self, stage: bool, dst_block: int, rx_kw: dict[str, Any]
    ) -> tuple[KVGeometry, Any, Receiver]:
        """The decode side in this process (``decode_end``)."""
        return decode_end(self.c, self.net, stage, dst_block, rx_kw)

    # ------------------------------------------------------------ names
    def code(self, lm: Logical) -> int:
        return self.net.code(lm, self.c.blocks, self.bad_manifest)

    def ghost(self) -> Ghost:
        shape = (LAYERS, 2, self.gp.kv_heads, BLOCK, HEAD_DIM)
        return Ghost(
            n_reqs=self.n,
            blocks=self.c.blocks,
            prefix=self.c.prefix,
            block_shape=shape,
            dtype=torch.float32,
            seed=self.seed,
            read=self.replica,
            shared_prompt=bool(self.c.host_cache),
        )

    # ------------------------------------------------------------ steps
    def step(self, name: str, args: dict[str, Any]) -> None:
        i, arg = decode_args(name, args)
        self.net.tick += 1
        if name in MESSAGE_ACTIONS:
            self._deliver(i, arg, name)
            return
        fn = getattr(self, "_" + name, None)
        if fn is None:
            raise ApiRefusal(f"{name}: the API adapter does not run it (see adapter.UNEXPRESSED)")
        fn(i, arg)
        self.tell_ends()  # the step may have ended a request (a cancel, a timeout, a crash)

    def abstract(self) -> World:
        reqs = []
        for i in range(self.n):
            rid = self.rid(i)
            sp = self.sender_view(i)
            ep = sp.get("ep") or self.ep[i]
            held = bool(self.pp[0].alloc.blocks_of(rid))
            rp = self.receiver_view(i)
            codes = [self.code(lm) for lm in self.net.flight if lm.rid == rid]
            net = tuple(sorted(codes + ([sp["nack"]] if sp.get("nack") else [])))
            tier = self.tier_fields(i)  # h, hl, gl, mv; p while a move is in progress
            reqs.append(
                Req(
                    st=self.st[i],
                    p=tier.pop("p")
                    if "p" in tier
                    else COMPLETE  # a streamed offer's freed source: the Senders' copies
                    if self.fs[i] and sp["live"]
                    else prefill_replica(held, bool(sp["live"])),
                    ep=ep,
                    ps=sp["ps"],
                    sent=sp["sent"],
                    phit=sp.get("phit", 0),
                    g=self.g[i],
                    net=net,
                    rinc=self.rinc(i),
                    **rp,
                    **self.stream_fields(i),
                    **tier,
                )
            )
        return World(
            tuple(reqs),
            faults=self.faults,
            p_up=self.p_up,
            d_up=self.d_up,
            p_inc=self.p_inc,
            d_inc=self.d_inc,
            **self.cache_world(),
            **self.prefix_world(),
        )

    def sender_view(self, i: int) -> dict[str, int]:
        """The prefill side's part of request i (``abstract.sender_part``)."""
        if not self.p_up:
            return {"ps": IDLE, "sent": 0, "live": 0}
        return sender_part(self.tx, self.rid(i), self.c.blocks)

    def receiver_view(self, i: int) -> dict[str, int]:
        """The decode side's part of request i (``abstract.receiver_part``)."""
        if not self.d_up:
            return {"d": 0, "dep": self.dead_dep[i], "landed": 0, "rmask": 0, "dfl": 0}
        rp: dict[str, int] = view(self.rx, "part", self.rid(i), self.c.blocks)
        rp["dep"] = max(rp["dep"], self.dead_dep[i])  # a restarted Receiver's fence
        return rp

    def check_integrity(self) -> None:
        problems = []
        for p in self.pp + self.hp:
            p.alloc.check_integrity()
        view(self.rx, "pool_integrity")
        for i in range(self.n):
            rid = self.rid(i)
            held = {len(p.alloc.blocks_of(rid)) for p in self.pp}
            if len(held) > 1:
                problems.append(f"{rid}: the prefill ranks hold {sorted(held)} blocks")
            if self.p_up and (e := self.sender_view(i).get("ep", 0)):
                if e != self.ep[i]:
                    problems.append(f"{rid}: the Senders' epoch {e}, the router's {self.ep[i]}")
        if problems:
            raise AssertionError("; ".join(problems))

    def replica(self, i: int, where: str) -> torch.Tensor | None:
        rid = self.rid(i)
        if where == "p":
            if self.fs[i] and not self.pp[0].alloc.blocks_of(rid):  # the Senders' copies
                return self.copies_replica(i)
            if not self.pp[0].alloc.blocks_of(rid):
                return None
            return torch.cat([p.gather(p.alloc.blocks_of(rid)) for p in self.pp], dim=3)
        if where == "h":
            return self.host_replica(i)
        if where == "d" and self._committed(i):
            return self.to_source(self.dp.gather(self.rx.result(rid).blocks))
        return None

    def to_source(self, kv: torch.Tensor) -> torch.Tensor:
        """Decode blocks [nd, L, F, H, bs_d, D] as the prompt's prefill-sized blocks."""
        n, bs = self.c.blocks, self.gd.block_size
        if bs == BLOCK:
            return kv
        L, F, H, D = kv.shape[1], kv.shape[2], kv.shape[3], kv.shape[5]
        tok = kv.permute(1, 2, 3, 0, 4, 5).reshape(L, F, H, -1, D)[:, :, :, : n * BLOCK]
        return tok.reshape(L, F, H, n, BLOCK, D).permute(3, 0, 1, 2, 4, 5).contiguous()

    def from_source(self, kv: torch.Tensor) -> torch.Tensor:
        """The inverse of ``to_source`` (decode room after the prompt: zeros)."""
        bs = self.gd.block_size
        if bs == BLOCK:
            return kv
        n, L, F, H, _, D = kv.shape
        nd = self.gd.blocks_for(n * BLOCK)
        tok = torch.zeros(L, F, H, nd * bs, D, dtype=kv.dtype)
        tok[:, :, :, : n * BLOCK] = kv.permute(1, 2, 3, 0, 4, 5).reshape(L, F, H, -1, D)
        return tok.reshape(L, F, H, nd, bs, D).permute(3, 0, 1, 2, 4, 5).contiguous()

    def data_problems(self) -> list[str]:
        """NoPartialUse on the decode side: a layer the Receiver reports ready holds, in
        the blocks ``held()`` names (the ones the engine reads), the attempt's bytes."""
        out = self.disk_problems()  # a disk copy outlives a prefill crash, whole
        for i in range(self.n):
            rid = self.rid(i)
            blocks = self.rx.held().get(rid) if self.d_up else None
            epoch = view(self.rx, "attempt_epoch", rid) if blocks else None
            if epoch is None or blocks is None:
                continue
            want = self.model.content(i, self.frozen[i].get(epoch, self.tokens[i]))
            got = self.to_source(self.dp.gather(list(blocks)))
            for layer in range(LAYERS):
                if self.rx.layer_ready(rid, layer) and not torch.equal(
                    got[:, layer], want[:, layer]
                ):
                    out.append(f"{rid}@d layer {layer} ready, not in its blocks")
        return out

    def snapshot(self) -> object:
        pools = tuple(
            (
                repr(p.alloc.counts()),
                tuple(p.alloc.holders()),
                p.gather(range(p.alloc.capacity)).sum().item(),
            )
            for p in self.pp
        ) + (tuple(view(self.rx, "pool_snapshot")),)
        flight = tuple(
            (lm.rid, tuple((c, t, bytes(d)) for c, t, d in lm.copies)) for lm in self.net.flight
        )
        ends = repr(
            [
                [(k, o.state, o.epoch) for k, o in s._offers.items()]  # noqa: SLF001
                for s in self.tx
            ]
            + view(self.rx, "ends")
        )
        regs = (tuple(self.st), tuple(self.ep), tuple(self.g), self.faults, self.p_up, self.d_up)
        incs = (self.p_inc, self.d_inc, tuple(self.kept_rinc))
        tiers = (self.tier_snapshot(), self.cache_snapshot(), self.pfx_blocks, self.offered)
        return (self.abstract(), pools, flight, ends, regs, incs, tiers)

    def held_blocks(self) -> dict[str, int]:
        return {
            "P": sum(p.alloc.capacity - p.alloc.num_free for p in self.pp),
            "D": view(self.rx, "pool_used") - len(self.pfx_blocks),  # the cache's own left out
            "H": self.host_held(),
        }


def decode_geometry(c: Config, dst_block: int) -> KVGeometry:
    heads = max(2, c.src_tp, c.dst_tp)
    return KVGeometry(LAYERS, heads, HEAD_DIM, dst_block, "float32", tp=c.dst_tp)


def decode_end(
    c: Config, net: Any, stage: bool, dst_block: int, rx_kw: dict[str, Any]
) -> tuple[KVGeometry, Any, Receiver]:
    """The decode side of a world: its geometry, its pools (the requests that fit: the
    spec's ``cap_d``) and its Receiver over ``net``."""
    gd = decode_geometry(c, dst_block)
    per_req = gd.blocks_for(c.blocks * BLOCK)
    whole = c.prefix and per_req == c.blocks  # the prefix's blocks and the requests' own
    dp = gd.make_pools(c.cap_d if whole else max(1, c.cap_d // c.blocks) * per_req)
    return gd, dp, Receiver(dp, gd, net, MODEL, stage=stage, **rx_kw)


def _switches(mutants: frozenset[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Senders' and the Receiver's keyword for the switches on (none: no keyword)."""
    if not mutants - _tier_switches(mutants):
        return {}, {}
    from refimpl.api.switches import (  # type: ignore[import-not-found,unused-ignore]
        RECEIVER_SWITCHES,
        SENDER_SWITCHES,
    )

    if rest := sorted(mutants - SENDER_SWITCHES - RECEIVER_SWITCHES):  # the rank switches
        raise ValueError(f"the switches {rest} are the rank ends': a world with decode ranks")
    mutants = mutants - _tier_switches(mutants)  # the DiskTier's (worlds/host_cache.py)
    tx, rx = mutants & SENDER_SWITCHES, mutants & RECEIVER_SWITCHES
    return ({"mutants": tx} if tx else {}), ({"mutants": rx} if rx else {})


def _tier_switches(mutants: frozenset[str]) -> frozenset[str]:
    from refimpl.api.switches import TIER_SWITCHES  # type: ignore[import-not-found,unused-ignore]

    return frozenset(mutants) & TIER_SWITCHES


def _rid_of(channel: str) -> tuple[str, bool]:
    """(request id, to the receiver?) of a channel named by ``wire.channels``."""
    rid = channel[3 : channel.rindex(">")]
    return rid, channel == channels(rid).to_receiver
