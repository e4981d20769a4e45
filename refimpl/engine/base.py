"""The engine's state: pools, per-request records, the wire, and the queries every action asks.

Ownership intervals (who may touch which blocks, and when):

    prefill GPU   holder "r<i>"          the request's blocks, logical order; writable
                                         while nothing else references them
                  holder "r<i>@pin<e>"   attempt e's frozen snapshot (read by its chunks)
                  holder "r<i>@store"    an offload reading the blocks
    host          holder "r<i>"          RESERVED while a store fills it, OWNED once
                                         committed (only then is it reloadable)
    decode GPU    holder "r<i>"          own blocks of attempt dep: RESERVED (writes land),
                                         OWNED once validated; QUARANTINED after an abort
                                         until the writer has quiesced or is fenced
                  holder "r<i>#pfx"      the shared prefix blocks the attempt reuses
                  holder "prefix-cache"  the cache's own reference to the prefix blocks

The records below hold what the allocators cannot: the router's status register, each side's
protocol registers (epochs, phases, counters) and the ghost history flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from refimpl.blocks import BlockStatus
from refimpl.checksum import bytes_checksum
from refimpl.chunks import pin_name
from refimpl.engine.data import RankPools, gen, token_chain
from refimpl.engine.wire import Wire, channel, parse
from refimpl.errors import OwnershipError
from refimpl.pool import PoolGeometry
from refimpl.transport import Payload
from spec import shardmap as sm
from spec.config import Config
from spec.manifest import LocalConfig, Manifest, RopeConfig, check_compatible, from_json_dict
from spec.manifest import ManifestError as SpecManifestError
from spec.mutants import MUTANTS
from spec.state import (
    COMPLETE,
    FILLING,
    IDLE,
    MSG_NAMES,
    NONE,
    PREEMPTED,
    QUARANTINED,
    QUEUED,
    REPLICA_NAMES,
    RESERVED,
    SENDER_NAMES,
    STATUS_NAMES,
    TO_DECODE,
    WRITABLE,
)
from spec.strict_json import StrictJSONError

STREAM_SWITCH = "reload_on_critical_stream"  # the seed's 6th failure; CUDA only
KNOWN_SWITCHES = frozenset(MUTANTS) | {STREAM_SWITCH}
PREFIX_CACHE = "prefix-cache"

# message name -> travels prefill->decode (True) or back (False)
KIND_TO_DECODE = {name: k in TO_DECODE for k, name in MSG_NAMES.items()}

BASE_KIND = {k: k.removesuffix("Corrupt").removesuffix("BadManifest") for k in KIND_TO_DECODE}

# decode receiver phases (per request, for attempt ``dep``)
RX_NONE, RX_WAITING, RX_VALIDATED, RX_COMMITTED, RX_QUARANTINED = range(5)


class NotEnabled(OwnershipError):
    """The action does not apply to this state at all (the spec's "not enabled")."""

    prop = None  # type: ignore[assignment]

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)

    def __str__(self) -> str:
        return f"[not enabled] {self.args[0]}"


class UnpublishedError(OwnershipError):
    """A host copy would become visible before its store completed."""

    prop = "PublishAfterCommit"


class LoadStoreError(OwnershipError):
    """A load would start while a store of the same request is in flight."""

    prop = "LoadXorStore"


class RankError(OwnershipError):
    """A transfer would complete before every source rank reported."""

    prop = "RankAgreement"


@dataclass(slots=True)
class ReqState:
    """The router's and the prefill worker's registers for one request."""

    status: int = QUEUED  # the router's status register (spec ``st``)
    epoch: int = 0  # handoff attempt last frozen (``ep``)
    phase: int = IDLE  # sender phase (``ps``)
    sent: int = 0  # items sent in this attempt (chunks and RankDones, rank-major)
    phit: int = 0  # prefix blocks decode said it holds (from Ready)
    dst: tuple[int, ...] = ()  # decode block ids of the sent blocks (from Ready)
    payloads: list[list[Payload]] = field(default_factory=list)  # [rank][block] snapshot
    checksums: list[list[str]] = field(default_factory=list)  # [rank][block] xxh3
    moves: int = 0  # offloads + preemptions (``mv``)
    stored: int = 0  # blocks the current store has copied (``hl``)
    loaded: int = 0  # blocks the current reload has copied (``gl``)
    reloading: bool = False  # a reload job owns the GPU blocks
    ghost: int = 0  # history flags (``g``)
    computed: bool = False  # the prefill blocks hold this request's KV (PrefillRun ran)
    steps: int = 0  # tokens appended so far
    slots: dict[tuple[int, int], int] = field(default_factory=dict)  # (block, slot) -> step
    window: list[int] = field(default_factory=list)  # ids pruned out of the window (``pw``)


@dataclass(slots=True)
class RxState:
    """The decode worker's receiver for one request (attempt ``dep``)."""

    dep: int = 0  # newest attempt seen: a fence for older ones
    phase: int = RX_NONE
    own: tuple[int, ...] = ()  # own destination blocks (logical blocks hit..n-1)
    landed: int = 0  # bitmask of chunk indices that arrived
    rmask: int = 0  # source ranks whose RankDone arrived
    rcnt: int = 0  # RankDones counted (only the duplicate_rank_counted mutant)
    manifest: Manifest | None = None
    mismatch: tuple[str, ...] = ()  # check_compatible's reasons (DF_MISMATCH iff any)
    corrupt: bool = False  # a chunk failed its checksum (DF_CORRUPT)
    fenced: bool = False  # attempt dep's writes fail at the closed connection (DF_FENCED)
    failed: bool = False  # decode failed attempt dep on its own error (DF_FAILED, DecodeFail)


class EngineBase:
    """Construction and shared queries; the actions live in the engine_* mixins."""

    def __init__(
        self,
        config: Config,
        *,
        seed: int = 0,
        mutants: frozenset[str] = frozenset(),
        block_size: int = 2,
        head_dim: int = 4,
        layers: int = 2,
        kv_heads: int | None = None,
        decode_layout: str = "tokens_major",
        dtype: torch.dtype = torch.float16,
        device: str | None = None,
    ) -> None:
        unknown = set(mutants) - KNOWN_SWITCHES
        if unknown:
            raise ValueError(f"unknown mutants {sorted(unknown)}; known: {sorted(KNOWN_SWITCHES)}")
        c = self.config = config
        self.seed, self.mutants = seed, frozenset(mutants)
        self.m = self.mutants & frozenset(MUTANTS)  # the spec's switches
        self.n = c.blocks
        h = kv_heads or math.lcm(c.src_tp, c.dst_tp)
        self.kv_heads, self.dtype = h, dtype
        self.p_local = LocalConfig(
            model_id="kvown-tiny",
            adapter_id=None,
            dtype=str(dtype).removeprefix("torch."),
            quantization="none",
            num_layers=layers,
            kv_heads=h,
            head_dim=head_dim,
            block_size=block_size,
            layout="heads_major",
            rope=RopeConfig(10000.0, head_dim),
            tp=c.src_tp,
            cp=1,
        )
        self.d_local = replace(self.p_local, layout=decode_layout, tp=c.dst_tp)
        self.p_geo = PoolGeometry.of_local(self.p_local, sm.tp_local_heads(h, c.src_tp))
        d_geo = PoolGeometry.of_local(self.d_local, sm.tp_local_heads(h, c.dst_tp))
        m = self.m
        p_guards = set()
        if m & {"source_writes_while_frozen", "reload_during_store"}:
            p_guards.add("FrozenSnapshot")  # lets a write land in pinned (frozen) blocks
        d_guards = set()
        if "free_on_cancel_in_flight" in m:
            d_guards.add("NoReuseUnderIO")  # lets an abort free blocks under a write
        if "evict_referenced_prefix" in m:
            d_guards.add("CapacityRefcount")  # lets the cache drop references it lacks
        self.P = RankPools(
            c.src_tp, h, self.p_geo, c.cap_p, device=device, disabled_guards=p_guards
        )
        self.H = RankPools(c.src_tp, h, self.p_geo, max(c.cap_h, 0), host=True, device=device)
        self.D = RankPools(c.dst_tp, h, d_geo, c.cap_d, device=device, disabled_guards=d_guards)
        self.wire = Wire(revocable=c.revocable)
        self.req = [ReqState() for _ in range(c.n_reqs)]
        self.rx = [RxState() for _ in range(c.n_reqs)]
        self.truth: list[torch.Tensor | None] = [None] * c.n_reqs  # full replica per request
        self.frozen_truth: list[torch.Tensor | None] = [None] * c.n_reqs  # at the last freeze
        self.faults, self.p_up, self.d_up = 0, True, True
        self.prefix_blocks: tuple[int, ...] = ()  # decode blocks of the cached prefix
        self.prefix_chain: list[str] = []  # their content hashes
        self._verdicts: dict[str, tuple[str, ...]] = {}  # manifest text -> refusal reasons
        self.tokens = [self._token_ids(i) for i in range(c.n_reqs)]
        if c.prefix:
            self._load_prefix()

    # ------------------------------------------------------------ data
    @property
    def block_shape_full(self) -> tuple[int, ...]:
        g = self.p_geo
        return (g.num_layers, g.num_fields, self.kv_heads, g.block_size, g.head_dim)

    def _token_ids(self, i: int) -> tuple[int, ...]:
        """Prompt tokens: the first ``prefix`` blocks are shared by every request."""
        bs = self.p_geo.block_size
        shared = [1000 + t for t in range(self.config.prefix * bs)]
        own = [100 * (i + 1) + t for t in range((self.n - self.config.prefix) * bs)]
        return tuple(shared + own)

    def _block_kv(self, i: int, j: int) -> torch.Tensor:
        """What prefill computes for logical block j of request i ([layers, 2, H, bs, D])."""
        if j < self.config.prefix:
            return gen(self.block_shape_full, self.dtype, self.seed, "prefix", j)
        return gen(self.block_shape_full, self.dtype, self.seed, "req", i, j)

    def _token_kv(self, i: int, k: int) -> torch.Tensor:
        g = self.p_geo
        shape = (g.num_layers, g.num_fields, self.kv_heads, g.head_dim)
        return gen(shape, self.dtype, self.seed, "tok", i, k)

    def _compute_kv(self, i: int) -> torch.Tensor:
        """(Re)compute request i's KV: the prompt's blocks, then every token written so far."""
        kv = torch.stack([self._block_kv(i, j) for j in range(self.n)])
        for (j, s), k in self.req[i].slots.items():
            kv[j, :, :, :, s] = self._token_kv(i, k)
        return kv

    def _next_slot(self, i: int) -> tuple[int, int] | None:
        """Where token ``steps`` goes: in place, cycling over the private (non-prefix) slots
        of the window (a block pruned out of it is freed: ``behaviours/window``).

        The spec has no token count, so the replica never grows. With a full prefix hit
        there is no private block: the step writes nothing (the spec allocates no block).
        """
        lo = max(self.config.prefix, len(self.req[i].window))
        private, k = self.n - lo, self.req[i].steps
        if private == 0:
            return None
        return lo + k % private, (k // private) % self.p_geo.block_size

    def _load_prefix(self) -> None:
        """The shared prefix is resident on decode at start (an earlier request left it)."""
        c = self.config
        blocks = self.D.alloc.allocate(PREFIX_CACHE, c.prefix)
        full = torch.stack([self._block_kv(-1, j) for j in range(c.prefix)])
        self.D.write_full(PREFIX_CACHE, blocks, full)
        self.prefix_blocks = tuple(blocks)
        self.prefix_chain = token_chain(
            self.tokens[0][: c.prefix * self.p_geo.block_size], self.p_geo.block_size
        )

    # ------------------------------------------------------------ derived statuses
    @staticmethod
    def rid(i: int) -> str:
        return f"r{i}"

    def pinned(self, i: int) -> bool:
        a, rid = self.P.alloc, self.rid(i)
        return bool(a.blocks_of(pin_name(rid, self.req[i].epoch)) or a.blocks_of(rid + "@store"))

    def p_status(self, i: int) -> int:
        """The prefill replica: FILLING (a reload owns it), COMPLETE (frozen), WRITABLE."""
        if self.req[i].reloading:
            return FILLING
        if not self.P.alloc.blocks_of(self.rid(i)):
            return NONE
        return COMPLETE if self.pinned(i) else WRITABLE

    def h_status(self, i: int) -> int:
        """The host replica: FILLING while a store fills it, COMPLETE once committed."""
        blocks = self.H.alloc.blocks_of(self.rid(i))
        if not blocks:
            return NONE
        return FILLING if self.H.alloc.status(blocks[0]) is BlockStatus.RESERVED else COMPLETE

    def d_status(self, i: int) -> int:
        x = self.rx[i]
        if x.phase == RX_WAITING:
            return FILLING if x.landed else RESERVED
        return (NONE, RESERVED, COMPLETE, WRITABLE, QUARANTINED)[x.phase]

    def hit(self, i: int) -> int:
        return len(self.D.alloc.blocks_of(self.rid(i) + "#pfx"))

    def pfx_refs(self) -> int:
        return sum(1 for i in range(self.config.n_reqs) if self.hit(i))

    # ------------------------------------------------------------ messages
    def send(
        self, i: int, kind: str, epoch: int, idx: int = 0, payload: Payload = b"", **extra: object
    ) -> None:
        """Queue a message; one to a dead worker vanishes (spec ``send``)."""
        to_d = KIND_TO_DECODE[kind]
        if (to_d and not self.d_up) or (not to_d and not self.p_up):
            return
        header = {"kind": kind, "req": i, "epoch": epoch, "idx": idx, **extra}
        self.wire.send(channel(i, to_d), header, payload)

    def _chunks_in_flight(self, i: int, epoch: int) -> bool:
        for text, _ in self.wire.entries(channel(i, True)):
            h = parse(text)
            if h["kind"] == "Chunk" and h["epoch"] == epoch:
                return True
        return False

    def _drop_chunks(self, i: int, epoch: int) -> None:
        self.wire.revoke(  # a fence or a flush: nothing, on an unrevocable transport
            channel(i, True), lambda h: h["kind"] == "Chunk" and h["epoch"] == epoch
        )

    def kind_name(self, text: str, data: Payload) -> str:
        """The spec's name of a message in flight, derived from its bytes: a chunk whose
        payload does not hash to its checksum is ChunkCorrupt; a manifest the decode side
        refuses is HandoffBadManifest."""
        h = parse(text)
        kind: str = h["kind"]
        if kind == "Chunk" and bytes_checksum(data) != h.get("checksum"):
            return "ChunkCorrupt"
        if kind == "Handoff" and self.manifest_refusals(text):
            return "HandoffBadManifest"
        return kind

    def manifest_refusals(self, text: str) -> tuple[str, ...]:
        """Every reason decode refuses the manifest of a Handoff (memoised by its text)."""
        v = self._verdicts.get(text)
        if v is None:
            try:
                m = from_json_dict(parse(text).get("manifest"))
            except SpecManifestError as e:  # the spec's class: refimpl's subclasses it
                v = tuple(e.reasons)
            except StrictJSONError as e:  # not strict JSON (NaN, too deep): no manifest
                v = (str(e),)
            else:
                v = check_compatible(m, self.d_local).reasons
            self._verdicts[text] = v
        return v

    def find(self, i: int, msg: str, epoch: int, idx: int) -> tuple[str, int]:
        """The channel and index of an in-flight message of request i, or NotEnabled."""
        if msg not in KIND_TO_DECODE:
            raise NotEnabled(f"unknown message kind {msg!r}")
        ch = channel(i, KIND_TO_DECODE[msg])

        base = BASE_KIND[msg]

        def match(text: str, data: Payload) -> bool:
            h = parse(text)
            if h["epoch"] != epoch or h["idx"] != idx or h["kind"] != base:
                return False
            return self.kind_name(text, data) == msg  # hashes a chunk: only the candidate

        k = self.wire.find(ch, match)
        if k < 0:
            raise NotEnabled(f"no {msg}(e={epoch},i={idx}) of r{i} in flight")
        return ch, k

    def describe(self, i: int) -> str:
        r = self.req[i]
        return (
            f"st={STATUS_NAMES[r.status]} p={REPLICA_NAMES[self.p_status(i)]} "
            f"d={REPLICA_NAMES[self.d_status(i)]} h={REPLICA_NAMES[self.h_status(i)]} "
            f"ps={SENDER_NAMES[r.phase]} ep={r.epoch} dep={self.rx[i].dep}"
        )

    # ------------------------------------------------------------ block helpers
    @staticmethod
    def release_all(pools: RankPools, holder: str) -> list[int]:
        """Drop every reference of ``holder``; its RESERVED blocks too (the caller knows no
        writer can land any more: the copy is local and stopped, or the attempt is over)."""
        a = pools.alloc
        moved = a.quarantine(holder)
        return moved + a.unquarantine_and_free(holder)

    def _timeouts_allowed(self) -> bool:
        if "sweep_only_on_admit" not in self.m:
            return True
        if not self.p_up or not self.P.alloc.can_allocate(self.n):
            return False
        return any(
            r.status in (QUEUED, PREEMPTED)
            and self.p_status(i) == NONE
            and self.h_status(i) == NONE
            for i, r in enumerate(self.req)
        )
