"""The refinement map ``abstract()`` and the engine's integrity checks.

``abstract()`` reads the engine's real state and returns the ``spec.state.World`` it is in:

    st, ep, ps, sent, phit, mv, g   the router's and the sender's registers
    p                               prefill allocator: no blocks NONE; a reload owns them
                                    FILLING; pinned by a snapshot or a store COMPLETE;
                                    else WRITABLE
    h                               host allocator: RESERVED blocks FILLING, OWNED COMPLETE
    hl, gl                          progress of the store / reload copy jobs
    d, dep, landed, rmask, rcnt     decode's receiver for the attempt it last reserved
    hit                             prefix blocks the request references on decode
    dfl                             the attempt's manifest refused / a chunk failed its
                                    checksum / the attempt fenced
    net                             the wire's entries, each named from its bytes
    pfx, pfx_ref                    the prefix cache holds blocks / requests referencing them
    pw                              the ids pruned out of the window (behaviours/window)
    hk, hc, hc_hl, hc_pin, hc_late, hc_bad   the shared host cache (behaviours/host_cache):
                                    the key's blocks RESERVED FILLING, OWNED COMPLETE while
                                    published (else QUARANTINED); the pin register; the
                                    abandoned attempts' holders; the bytes vs their checksums

``check_integrity()`` checks each allocator's conservation law, then that the records and
the allocators agree. ``committed_bytes_ok()`` compares replicas with the ground truth.
"""

from __future__ import annotations

import torch

from refimpl.blocks import BlockStatus
from refimpl.checksum import block_checksum, bytes_checksum
from refimpl.chunks import pin_name
from refimpl.engine.async_steps import AsyncStepActions
from refimpl.engine.base import (
    PREFIX_CACHE,
    RX_COMMITTED,
    RX_NONE,
    RX_QUARANTINED,
    RX_VALIDATED,
    RX_WAITING,
)
from refimpl.engine.behaviours import (
    DecodeRankActions,
    HostCacheActions,
    RetractActions,
    StreamActions,
    TurnActions,
    WindowActions,
)
from refimpl.engine.data import RankPools
from refimpl.engine.wire import channel, parse
from refimpl.errors import IntegrityError
from spec.state import (
    COMPLETE,
    DF_CORRUPT,
    DF_FAILED,
    DF_FENCED,
    DF_MISMATCH,
    DF_UNSTAGED,
    MSG_NAMES,
    NONE,
    WRITABLE,
    Req,
    World,
    msg,
)

CODE_OF = {name: code for code, name in MSG_NAMES.items()}


class AbstractMap(
    TurnActions,
    HostCacheActions,
    AsyncStepActions,
    RetractActions,
    DecodeRankActions,
    StreamActions,
    WindowActions,
):
    def net_of(self, i: int) -> tuple[int, ...]:
        """Request i's messages in flight, as the spec's sorted codes."""
        codes = []
        for to_d in (True, False):
            for text, data in self.wire.entries(channel(i, to_d)):
                h = parse(text)
                kind = CODE_OF[self.kind_name(text, data)]
                codes.append(msg(kind, h["epoch"], h["idx"], h.get("inc", 0)))
        return tuple(sorted(codes))

    def abstract(self) -> World:
        reqs = []
        for i, (r, x) in enumerate(zip(self.req, self.rx, strict=True)):
            dfl = (DF_MISMATCH if x.mismatch else 0) | (DF_CORRUPT if x.corrupt else 0)
            dfl |= DF_UNSTAGED if self.unstaged[i] else 0
            reqs.append(
                Req(
                    st=r.status,
                    p=self.p_status(i),
                    d=self.d_status(i),
                    h=self.h_status(i),
                    ep=r.epoch,
                    dep=x.dep,
                    ps=r.phase,
                    sent=r.sent,
                    phit=r.phit,
                    hit=self.hit(i),
                    landed=x.landed,
                    rmask=x.rmask,
                    rcnt=x.rcnt,
                    dfl=dfl | (DF_FENCED if x.fenced else 0) | (DF_FAILED if x.failed else 0),
                    hl=r.stored,
                    gl=r.loaded,
                    mv=r.moves,
                    g=r.ghost,
                    net=self.net_of(i),
                    pstep=self.step_registers(i)[0],
                    dstep=self.step_registers(i)[1],
                    dmask=self.dmask_of(i),
                    rinc=self.rinc[i],
                    stg=self.stg[i],
                    sl=int(self.config.slots and x.phase != RX_NONE and self.d_up),
                    hk=self.hk[i],
                    tn=self.turns[i].tn,
                    ti=self.turns[i].ti,
                    tdv=int(self.turns[i].divergent()),
                    tc=self.turns[i].tc,
                    lay=self.lay[i],
                    cpy=len(self.copies[i]),
                    fs=int(self.fs[i]),
                    inl=self.inl[i],
                    rdy=self.rdy[i],
                    pw=len(r.window),
                )
            )
        return World(
            reqs=tuple(reqs),
            faults=self.faults,
            p_up=self.p_up,
            d_up=self.d_up,
            pfx=bool(self.prefix_blocks),
            pfx_ref=self.pfx_refs(),
            p_inc=self.p_inc,
            d_inc=self.d_inc,
            pfx_ok=self.pfx_ok,
            hc=self.hc_status(),
            hc_hl=self.hc_hl,
            hc_pin=self.hc_pin,
            hc_late=len(self.hc_late),
            hc_bad=self.hc_bad(),
        )

    # ------------------------------------------------------------ integrity
    def check_integrity(self) -> None:
        """Each pool's conservation law, then records vs allocators; raises listing all."""
        for pools in (self.P, self.H, self.D):
            pools.alloc.check_integrity()
        problems: list[str] = []
        n, P, H, D = self.n, self.P.alloc, self.H.alloc, self.D.alloc
        for i, (r, x) in enumerate(zip(self.req, self.rx, strict=True)):
            rid = self.rid(i)
            own_p, own_h = P.blocks_of(rid), H.blocks_of(rid)
            if len(own_p) not in (0, n - len(r.window)) or len(own_h) not in (0, n):
                problems.append(f"{rid}: {len(own_p)} prefill / {len(own_h)} host blocks of {n}")
            for holder in (pin_name(rid, r.epoch), rid + "@store"):
                if not set(P.blocks_of(holder)) <= set(own_p):
                    problems.append(f"{holder} pins blocks {rid} does not hold")
            if {P.status(b) for b in own_p} - {BlockStatus.OWNED, BlockStatus.RESERVED}:
                problems.append(f"{rid}: prefill blocks {own_p} not all held")
            own_d, quar = D.blocks_of(rid), set(D.quarantined(rid))
            want = {
                RX_NONE: ((), set()),
                RX_WAITING: (x.own, set()),
                RX_VALIDATED: (x.own, set()),
                RX_COMMITTED: (x.own, set()),
                RX_QUARANTINED: ((), set(x.own)),
            }[x.phase]
            if (own_d, quar) != want:
                problems.append(f"{rid}: decode holds {own_d}, quarantined {sorted(quar)}")
            status = BlockStatus.RESERVED if x.phase == RX_WAITING else BlockStatus.OWNED
            if any(D.status(b) is not status for b in own_d):
                problems.append(f"{rid}: decode blocks {own_d} not all {status.value}")
            if x.phase == RX_NONE and self.hit(i):
                problems.append(f"{rid}: references the prefix without an attempt")
        refs = self.pfx_refs()
        for b in self.prefix_blocks:
            if D.refcount(b) != 1 + refs or D.owner(b) != PREFIX_CACHE:
                problems.append(f"prefix block {b}: refcount {D.refcount(b)}, {refs} requests")
        if problems:
            raise IntegrityError(
                f"P {P.counts()} H {H.counts()} D {D.counts()} prefix {self.prefix_blocks} "
                f"refs {refs}: " + "; ".join(problems)
            )

    # ------------------------------------------------------------ bytes
    def replica(self, i: int, where: str) -> torch.Tensor | None:
        """Request i's replica at "p", "h" or "d" as [n, layers, 2, H, bs, D] (None: none)."""
        rid = self.rid(i)
        if where == "d":
            if self.rx[i].phase == RX_NONE:
                return None
            return self.D.gather(self.D.alloc.blocks_of(rid + "#pfx") + self.rx[i].own)
        if where == "p" and self.streamed_out(i):  # a streamed offer's copies (behaviours)
            return self.stream_copies(i)
        pools: RankPools = self.P if where == "p" else self.H
        blocks = pools.alloc.blocks_of(rid)
        return pools.gather(blocks) if blocks else None

    def damaged(self) -> list[str]:
        """Replicas whose bytes differ from the ground truth: a writable replica must hold
        the truth, a complete one (a frozen source, a host copy, a validated destination)
        the truth as it was when its snapshot was taken (a writer may have moved on: the
        source of a committed handoff is released once the Ack arrives)."""
        out = []
        for i in range(len(self.req)):
            truth, frozen = self.truth[i], self.frozen_truth[i]
            if truth is None:
                continue
            status = {"p": self.p_status(i), "h": self.h_status(i), "d": self.d_status(i)}
            if not self.req[i].computed:  # admitted, KV not computed yet: nothing to check
                status["p"] = NONE
            for w, s in status.items():
                want = truth if s == WRITABLE else frozen if s == COMPLETE else None
                if want is None:
                    continue
                if w == "p":  # the window's blocks (those pruned out of it are freed)
                    want = want[len(self.req[i].window) :]
                rep = self.replica(i, w)
                if rep is None or not torch.equal(rep, want):
                    out.append(f"r{i}@{w}")
        return out

    def committed_bytes_ok(self) -> bool:
        """Every complete/writable replica's bytes equal the ground truth (torch.equal)."""
        return not self.damaged()

    def fingerprint(self) -> tuple[object, ...]:
        """Everything an action may change, for "a refusal changes nothing" tests: the
        abstract state, every block's bookkeeping, every pool's bytes, the wire, the
        records."""
        blocks = []
        for pools in (self.P, self.H, self.D):
            a = pools.alloc
            blocks.append(
                (
                    tuple(
                        (a.status(b), a.refcount(b), a.owner(b), a.epoch(b))
                        for b in range(a.capacity)
                    ),
                    tuple((h, a.blocks_of(h)) for h in sorted(a.holders())),
                    a.quarantined(),
                    tuple(block_checksum(q.kv) for q in pools.pools),
                )
            )
        wire = tuple(
            (ch, tuple((t, bytes_checksum(d)) for t, d in self.wire.entries(ch)))
            for ch in self.wire.channels()
        )
        records = repr((self.req, self.rx, self.prefix_blocks, self.faults, self.p_up, self.d_up))
        return (self.abstract(), tuple(blocks), wire, records)
