"""The handoff data path of `kvown demo`: two workers on the public API (`refimpl.api`).

A `Worker` is one side (prefill or decode): a TinyDecoder, the `LocalConfig` it runs (as
a `KVGeometry` and a `ModelIdentity`), one CPU pool per TP rank (`RankPools`: the ranks
share one block table) and a prefix cache. `handoff` moves one request's KV from a
prefill worker to a decode worker with `refimpl.api.handoff` over an `InProcessTransport`
(JSON headers and byte payloads only; the conversation is `refimpl.api.wire`'s):

  P   freeze the request's blocks past the prefix D holds (pinned, read-only), one xxh3
      per canonical block (heads_major, every head, the sender's block size)
  P -> D  manifest ...... D: validate + check_compatible + reserve, or nack
  P -> D  one chunk per (primary TP rank, block), its xxh3 in the header
  D   per chunk: request, epoch, rank, index, size, xxh3(bytes) == header; the bytes land
      in staging (never in the target blocks); per block: the canonical block hashes to
      the manifest's checksum; only then reshard into the target (TP, block size,
      layout), commit, ack; P releases the pins and frees the request

Staging (`stage=True`) keeps the target blocks untouched until every block verified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from refimpl.api import KVGeometry, ModelIdentity, Receiver, Sender
from refimpl.api import handoff as api_handoff
from refimpl.engine.data import token_chain
from refimpl.model import PagedKV, RopeConfig, TinyDecoder
from refimpl.reshard import ReshardStats, ShardedKV
from refimpl.transport import InProcessTransport
from spec import shardmap as sm
from spec.manifest import DTYPE_BYTES, LocalConfig, Manifest, Verdict, check_compatible

MODEL_ID = "kvown-tiny"
PREFIX_CACHE = "prefix-cache"


def manifest_rope(rope: RopeConfig) -> RopeConfig:
    return rope  # the model's RoPE type is the manifest's


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
            pool_bytes=capacity
            * cfg.layers
            * 2  # cache fields k, v
            * cfg.kv_heads
            * block_size
            * cfg.head_dim
            * DTYPE_BYTES[cfg.dtype],
        )
        self.geometry = KVGeometry.from_local_config(self.local)  # the one geometry type
        self.rp = self.geometry.make_pools(capacity, device="cpu")
        self.decl = cfg.kv_layout(layout, block_size, tp)
        self.identity = ModelIdentity(self.local.model_id, self.local.rope, adapter_id)
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
    reshard: ReshardStats | None = None  # not measured through the API


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
    """Move `rid`'s prefilled KV from `src` to `dst` through the public API.

    `dst` shares the longest cached prefix that is whole blocks on both sides; the rest
    lands in staging, is verified end to end, then resharded into its blocks.
    `mismatch_installed` (the spec mutant's name) skips the refusal of an incompatible
    manifest: the bug under test, off by default. Raises ManifestError or CapacityError
    (refused with a nack) or a ChunkError/ChecksumError (aborted); either way nothing is
    kept on `dst` and the pins on `src` are released.
    """
    t = transport or InProcessTransport(copy_payload=True)
    step = math.lcm(src.block_size, dst.block_size)  # whole blocks on both sides
    hit = dst.prefix_hit(token_ids)
    prefix = hit[: len(hit) * dst.block_size // step * step // dst.block_size]
    tx = Sender(src.rp, src.geometry, t, src.identity)
    guards = ("ManifestGate",) if mismatch_installed else ()
    rx = Receiver(dst.rp, dst.geometry, t, dst.identity, stage=True, disabled_guards=guards)
    held = token_ids[: len(prefix) * dst.block_size]  # the chain hashes of these tokens hit
    res = api_handoff(
        tx,
        rx,
        rid,
        token_ids,
        epoch=epoch,
        decode_room=decode_room,
        prefix=prefix,
        prefix_tokens=held,
    )
    m = res.received.manifest
    return Handoff(
        manifest=m,
        verdict=check_compatible(m, dst.local),
        store=dst.store(res.received.blocks, m.num_tokens),
        first_token=first_token,
        blocks_sent=len(m.sent_blocks),
        chunks=res.chunks,
        bytes_sent=res.bytes_sent,
        checksums_verified=rx.checks(rid),
    )
