"""The handoff data path of `kvown demo`: two workers, JSON over a transport, verify, reshard.

A `Worker` is one side (prefill or decode): a TinyDecoder, the `LocalConfig` it runs and
one CPU pool per TP rank (`RankPools`: the ranks share one block table).  `handoff` moves
one request's KV from a prefill worker to a decode worker through an `InProcessTransport`
(JSON headers and byte payloads only; nothing else crosses):

  P -> D  hello     token_ids, P's block size: which prefix does D already hold?
  D -> P  hello     prefix_blocks (in P's block size), D's tp and cp
  P       freeze every TP rank's blocks from prefix_blocks on (pinned, read-only), and
          build the manifest from the real tensors (RoPE, layout, block size, both
          meshes, one xxh3 per canonical block, see below)
  P -> D  manifest  (JSON), with the greedy first token prefill produced
  D       parse + check_compatible: refuse (nack, nothing reserved) or go on
  D       reserve staging blocks in P's geometry (src tp, block size, layout) and target
          blocks in D's own; share the prefix blocks from D's prefix cache
  D -> P  ready
  P -> D  one chunk per (primary TP rank, block): the raw bytes of that rank's block,
          with their xxh3 in the header
  D       per chunk: request, epoch, rank, index, and xxh3(bytes) == header; then
          the bytes land in staging (never in the target pools)
  D       per block: the canonical block reassembled from staging hashes to the
          manifest's checksum; only then is anything installed:
  D       reshard staging -> target (TP, block size, layout; the tokens past the prefix)
  D       commit the target blocks (RESERVED -> OWNED), free staging
  D -> P  ack
  P       release the pins and free the request's blocks

Why staging.  `refimpl.chunks.ChunkReceiver` installs a chunk straight into a block of
the same geometry (only the axis order may differ) and checks it against the manifest's
checksum of a whole TP=1 block; a TP-rank shard matches neither.  So the receiver here
lands the shards in the sender's own geometry first, verifies, then reshards.

Canonical block: heads_major [layers, 2, kv_heads, block_size, head_dim], every head, in
the sender's block size (`RankPools.gather`): checksums independent of TP and layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from refimpl.blocks import BlockStatus
from refimpl.checksum import block_checksum, bytes_checksum
from refimpl.chunks import MANIFEST, Snapshot, build_manifest, freeze, release, send_chunks
from refimpl.engine.data import RankPools, token_chain
from refimpl.errors import CapacityError as Full
from refimpl.errors import ChecksumError, ChunkError, IncompleteError, ManifestError, StaleError
from refimpl.model import PagedKV, RopeConfig, TinyDecoder
from refimpl.pool import TORCH_DTYPES, PoolGeometry
from refimpl.reshard import KVLayout, ReshardStats, ShardedKV, reshard
from refimpl.transport import InProcessTransport, Payload, Transport
from spec import shardmap as sm
from spec.manifest import DTYPE_BYTES, LocalConfig, Manifest, Verdict, check_compatible
from spec.manifest import ManifestError as SpecManifestError
from spec.manifest import from_json_dict as manifest_from_json

MODEL_ID = "kvown-tiny"
PREFIX_CACHE = "prefix-cache"


def manifest_rope(rope: RopeConfig) -> RopeConfig:
    return rope  # the model's RoPE type is the manifest's


def pool_geometry(
    layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, tp: int, bs: int, layout: str
) -> PoolGeometry:
    """One TP rank's block: its local heads (replicated when kv_heads < tp)."""
    return PoolGeometry(layers, 2, sm.tp_local_heads(kv_heads, tp), bs, head_dim, dtype, layout)


class Worker:
    """One side of the handoff; pools on CPU, where the TinyDecoder runs."""

    def __init__(
        self,
        model: TinyDecoder,
        *,
        tp: int,
        block_size: int,
        layout: str,
        capacity: int,
        adapter_id: str | None = None,
    ) -> None:
        cfg = model.cfg
        if cfg.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {cfg.dtype!r} has no manifest name; use float32")
        self.model = model
        self.local = LocalConfig(
            model_id=MODEL_ID,
            adapter_id=adapter_id,
            dtype=cfg.dtype,
            quantization="none",
            num_layers=cfg.layers,
            kv_heads=cfg.kv_heads,
            head_dim=cfg.head_dim,
            block_size=block_size,
            layout=layout,
            rope=manifest_rope(cfg.rope),
            tp=tp,
            cp=1,
        )
        geo = pool_geometry(
            cfg.layers, cfg.kv_heads, cfg.head_dim, cfg.torch_dtype, tp, block_size, layout
        )
        self.rp = RankPools(tp, cfg.kv_heads, geo, capacity, device="cpu")
        self.decl = cfg.kv_layout(layout, block_size, tp)
        self.cache: dict[str, int] = {}  # token-chain hash of a full block -> physical block

    @property
    def block_size(self) -> int:
        return self.decl.block_size

    def store(self, table: Sequence[int], num_tokens: int = 0) -> PagedKV:
        """The model's view of a request whose logical blocks live at `table`."""
        pools = [[p.kv] for p in self.rp.pools]
        return PagedKV(ShardedKV(self.decl, pools, [list(table)], num_tokens))

    def prefill(
        self, rid: str, prompt: torch.Tensor, room: int = 0
    ) -> tuple[torch.Tensor, PagedKV]:
        """Allocate blocks for the prompt (+ `room` tokens) and run it: logits (T, V)."""
        n = sm.blocks_needed(prompt.shape[0] + room, self.block_size)
        store = self.store(self.rp.alloc.allocate(rid, n))
        return self.model.prefill(prompt, store), store

    def cache_prefix(self, rid: str, token_ids: Sequence[int]) -> None:
        """Keep `rid`'s full blocks in the prefix cache (one reference each)."""
        blocks = self.rp.alloc.blocks_of(rid)
        for j, h in enumerate(token_chain(token_ids, self.block_size)):
            if h not in self.cache:
                self.rp.alloc.incref(PREFIX_CACHE, [blocks[j]])
                self.cache[h] = blocks[j]

    def prefix_hit(self, token_ids: Sequence[int]) -> list[int]:
        """Physical blocks of the longest cached prefix of `token_ids`."""
        hit = []
        for h in token_chain(token_ids, self.block_size):
            if h not in self.cache:
                break
            hit.append(self.cache[h])
        return hit

    def finish(self, rid: str) -> None:
        """The request is done: drop its blocks and its prefix references."""
        self.rp.alloc.free(rid)
        self.rp.alloc.free(f"{rid}#pfx")

    def pool_bytes(self) -> list[torch.Tensor]:
        return [p.kv.clone() for p in self.rp.pools]


@dataclass
class Handoff:
    """What one handoff did, counted on the wire and at the receiver."""

    manifest: Manifest
    verdict: Verdict
    store: PagedKV  # the decode side's KV of the request, ready to decode
    first_token: int
    blocks_sent: int = 0  # logical blocks (sender's block size) carried by chunks
    chunks: int = 0
    bytes_sent: int = 0  # chunk payload bytes over the transport
    checksums_verified: int = 0  # per-chunk hashes + per-block end-to-end hashes
    reshard: ReshardStats | None = None  # staging -> target copies


class Sender:
    """The prefill side of one attempt; talks to the decode side only through `t`."""

    def __init__(self, w: Worker, t: Transport, rid: str, epoch: int) -> None:
        self.w, self.t, self.rid, self.epoch = w, t, rid, epoch
        self.out, self.inbox = f"{rid}>d", f"{rid}>p"
        self.snaps: list[Snapshot] = []
        self.bytes_sent = self.chunks = 0

    def hello(self, token_ids: Sequence[int]) -> None:
        hdr = {"type": "hello", "token_ids": list(token_ids), "block_size": self.w.block_size}
        self.t.send(self.out, hdr)

    def handoff(self, token_ids: Sequence[int], first_token: int) -> None:
        """Read D's hello; freeze from the prefix on; send the manifest."""
        (reply, _), *_ = self.t.poll(self.inbox)
        pools, rp = self.w.rp.pools, self.w.rp
        first = int(reply["prefix_blocks"])
        self.snaps = [
            freeze(pools[r], self.rid, self.epoch, first_block=first) for r in range(rp.tp)
        ]
        blocks = self.snaps[0].block_ids
        sums = tuple(block_checksum(f) for f in rp.gather(blocks))  # canonical blocks
        snap = Snapshot(self.rid, self.epoch, blocks, first, sums, ())
        m = build_manifest(
            snap, self.w.local, token_ids=token_ids, dst_tp=reply["tp"], dst_cp=reply["cp"]
        )
        hdr = {"type": MANIFEST, "manifest": m.to_json_dict(), "first_token": first_token}
        self.t.send(self.out, hdr)

    def on_reply(self) -> list[str]:
        """Ready: send every primary rank's chunks.  Nack: release; returns its reasons."""
        (reply, _), *_ = self.t.poll(self.inbox)
        if reply["type"] != "ready":
            self.release()
            return list(reply["reasons"])
        for r in self.w.rp.primaries:
            self.chunks += send_chunks(self.t, self.out, self.snaps[r], rank=r)
            self.bytes_sent += sum(len(p) for p in self.snaps[r].payloads)
        return []

    def on_ack(self) -> None:
        (reply, _), *_ = self.t.poll(self.inbox)
        if reply["type"] != "ack":
            raise StaleError(f"expected ack, got {reply['type']!r}")
        self.release()
        self.w.rp.alloc.free(self.rid)

    def release(self) -> None:
        for r, snap in enumerate(self.snaps):
            release(self.w.rp.pools[r], snap)
        self.snaps = []


class Receiver:
    """The decode side of one attempt.  `mismatch_installed` (the spec mutant's name)
    skips the refusal of an incompatible manifest: the bug under test, off by default."""

    def __init__(
        self, w: Worker, t: Transport, rid: str, *, decode_room: int, mismatch_installed: bool
    ) -> None:
        self.w, self.t, self.rid, self.room = w, t, rid, decode_room
        self.inbox, self.out = f"{rid}>d", f"{rid}>p"
        self.mismatch_installed = mismatch_installed
        self.landed: set[tuple[int, int]] = set()
        self.checks = 0

    def on_hello(self) -> None:
        (hdr, _), *_ = self.t.poll(self.inbox)
        src_bs = int(hdr["block_size"])
        hit_tokens = len(self.w.prefix_hit(hdr["token_ids"])) * self.w.block_size
        step = math.lcm(src_bs, self.w.block_size)  # whole blocks on both sides
        blocks = hit_tokens // step * step // src_bs
        self.t.send(
            self.out, {"type": "hello", "prefix_blocks": blocks, "tp": self.w.rp.tp, "cp": 1}
        )

    def on_manifest(self) -> tuple[Manifest, Verdict, int]:
        """Validate before anything is reserved; refuse with a nack listing every reason."""
        (hdr, _), *_ = self.t.poll(self.inbox)
        try:
            m = manifest_from_json(hdr.get("manifest"))
            verdict = check_compatible(m, self.w.local)
            pre_tokens = m.prefix_blocks * m.block_size
            if pre_tokens % self.w.block_size or m.src_cp != 1:
                raise ManifestError([f"prefix of {pre_tokens} tokens / src_cp={m.src_cp}"])
            self.prefix = self.w.prefix_hit(m.token_ids)[: pre_tokens // self.w.block_size]
            if len(self.prefix) * self.w.block_size != pre_tokens:
                raise ManifestError([f"prefix_blocks: {m.prefix_blocks} are not held here"])
            if not verdict.ok and not self.mismatch_installed:
                raise ManifestError(list(verdict.reasons))
        except SpecManifestError as e:  # malformed, incompatible, or a prefix not held
            self.t.send(self.out, {"type": "nack", "reasons": e.reasons})
            raise ManifestError.from_spec(e) from None
        self.m = m
        try:
            self._reserve(m)
        except Full as e:  # no room here: nothing kept, the sender is told
            self.t.send(self.out, {"type": "nack", "reasons": [str(e)]})
            raise
        self.t.send(self.out, {"type": "ready"})
        return m, verdict, int(hdr["first_token"])

    def _reserve(self, m: Manifest) -> None:
        alloc, bs = self.w.rp.alloc, self.w.block_size
        own = sm.blocks_needed(m.num_tokens + self.room, bs) - len(self.prefix)
        self.own = alloc.reserve(self.rid, own, epoch=m.epoch)  # CapacityError: nothing taken
        alloc.incref(f"{self.rid}#pfx", self.prefix)
        geo = pool_geometry(
            m.num_layers, m.kv_heads, m.head_dim, TORCH_DTYPES[m.dtype], m.src_tp,
            m.block_size, m.layout,
        )  # fmt: skip
        self.staging = RankPools(m.src_tp, m.kv_heads, geo, len(m.sent_blocks), device="cpu")
        self.stage_ids = self.staging.alloc.reserve(self.rid, len(m.sent_blocks), epoch=m.epoch)

    def receive(self, header: dict[str, Any], payload: Payload) -> bool:
        """Verify one chunk, then land it in staging; False for a duplicate."""
        m = self.m
        if header.get("request_id") != m.request_id or header.get("epoch") != m.epoch:
            raise StaleError(f"chunk of {header.get('request_id')!r} @{header.get('epoch')!r}")
        rank, idx = header.get("rank"), header.get("block_index")
        if type(rank) is not int or rank not in self.staging.primaries:
            raise ChunkError(f"chunk from rank {rank!r}", prop="RankAgreement")
        if type(idx) is not int or idx not in m.sent_blocks:
            raise ChunkError(f"block_index {idx!r} not in {m.sent_blocks}")
        if (rank, idx) in self.landed:
            return False
        if bytes_checksum(payload) != header.get("checksum"):
            raise ChecksumError(f"rank {rank} block {idx}: bytes do not hash to the header's")
        self.checks += 1
        b = self.stage_ids[idx - m.prefix_blocks]
        self.staging.pools[rank].write_block_bytes(self.rid, b, payload)
        self.landed.add((rank, idx))
        return True

    def on_chunks(self) -> None:
        for header, payload in self.t.poll(self.inbox):
            self.receive(header, payload)

    def install(self) -> tuple[PagedKV, ReshardStats]:
        """End-to-end check of every block, then reshard into the target, commit, ack."""
        m = self.m
        want = {(r, i) for r in self.staging.primaries for i in m.sent_blocks}
        if self.landed != want:
            raise IncompleteError(f"chunks {sorted(want - self.landed)} missing")
        for k, full in enumerate(self.staging.gather(self.stage_ids)):
            if block_checksum(full) != m.block_checksums[k]:
                raise ChecksumError(f"block {m.prefix_blocks + k} != the manifest's checksum")
            self.checks += 1
        decl = KVLayout(
            m.layout, m.num_layers, m.kv_heads, m.block_size, m.head_dim, m.src_tp, m.src_cp
        )
        src = ShardedKV(
            decl,
            [[p.kv] for p in self.staging.pools],
            [self.stage_ids[:1] * m.prefix_blocks + self.stage_ids],  # prefix: never read
            m.num_tokens,
        )
        alloc = self.w.rp.alloc
        alloc.check_write(self.rid, self.own)  # the one writer of the target blocks
        store = self.w.store([*self.prefix, *self.own], m.num_tokens)
        stats = ReshardStats(0, 0, 0)  # a full prefix hit moves nothing
        if self.stage_ids:
            stats = reshard(src, store.kv, start=m.prefix_blocks * m.block_size)
        alloc.commit(self.rid, m.epoch)
        self.staging.alloc.commit(self.rid, m.epoch)
        self.staging.alloc.free(self.rid)
        self.t.send(self.out, {"type": "ack"})
        return store, stats

    def abort(self) -> None:
        """A failed attempt: nothing was installed; give back what it reserved."""
        alloc = self.w.rp.alloc
        alloc.quarantine(self.rid)  # synchronous here: no writer can still land bytes
        alloc.unquarantine_and_free(self.rid)
        alloc.free(f"{self.rid}#pfx")


def handoff(
    src: Worker,
    dst: Worker,
    rid: str,
    token_ids: Sequence[int],
    first_token: int,
    *,
    decode_room: int = 0,
    epoch: int = 1,
    transport: InProcessTransport | None = None,
    mismatch_installed: bool = False,
) -> Handoff:
    """Move `rid`'s prefilled KV from `src` to `dst` (see the module docstring).

    Raises ManifestError or CapacityError (refused with a nack: nothing kept on `dst`, the
    pins on `src` released) or a ChunkError/ChecksumError (aborted: nothing installed).
    """
    t = transport or InProcessTransport(copy_payload=True)
    tx = Sender(src, t, rid, epoch)
    rx = Receiver(dst, t, rid, decode_room=decode_room, mismatch_installed=mismatch_installed)
    tx.hello(token_ids)
    rx.on_hello()
    tx.handoff(token_ids, first_token)
    try:
        m, verdict, first = rx.on_manifest()
    except (ManifestError, Full):
        tx.on_reply()  # the nack: release the snapshot
        raise
    tx.on_reply()
    try:
        rx.on_chunks()
        store, stats = rx.install()
    except Exception:
        rx.abort()
        tx.release()
        raise
    tx.on_ack()
    assert all(dst.rp.alloc.status(b) is BlockStatus.OWNED for b in rx.own)
    return Handoff(
        manifest=m,
        verdict=verdict,
        store=store,
        first_token=first,
        blocks_sent=len(m.sent_blocks),
        chunks=tx.chunks,
        bytes_sent=tx.bytes_sent,
        checksums_verified=rx.checks,
        reshard=stats,
    )
