"""Shared setup of the library tests: two sides with real pools, a request's KV written."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refimpl.api import KVGeometry, ModelIdentity, Receiver, Sender, write_kv
from refimpl.engine.data import RankPools
from refimpl.transport import InProcessTransport
from spec.manifest import RopeConfig

MODEL = ModelIdentity("lib-test", RopeConfig(10000.0, 8))
BASE = dict(num_layers=2, kv_heads=4, head_dim=8, block_size=4, dtype="float32")


def geo(**kw: object) -> KVGeometry:
    return KVGeometry(**{**BASE, **kw})  # type: ignore[arg-type]


@dataclass
class Pair:
    t: InProcessTransport
    src: RankPools
    dst: RankPools
    tx: Sender
    rx: Receiver


def pair(src: KVGeometry, dst: KVGeometry, *, src_cap: int = 16, dst_cap: int = 16) -> Pair:
    t = InProcessTransport()
    ps, pd = src.make_pools(src_cap), dst.make_pools(dst_cap)
    return Pair(t, ps, pd, Sender(ps, src, t, MODEL), Receiver(pd, dst, t, MODEL))


def prefill(
    p: Pair, rid: str, num_tokens: int, *, room_blocks: int = 0, seed: int = 0
) -> torch.Tensor:
    """Allocate and fill ``rid``'s blocks at the source; returns its KV [L, F, H, T, D]."""
    g = p.tx.geometry
    blocks = p.src.alloc.allocate(rid, g.blocks_for(num_tokens) + room_blocks)
    kv = torch.randn(
        (g.num_layers, 2, g.kv_heads, num_tokens, g.head_dim),
        generator=torch.Generator().manual_seed(seed),
    ).to(g.torch_dtype)
    write_kv(p.src, rid, blocks, [list(layer) for layer in kv])
    return kv


def held(pools: RankPools) -> dict[str, int]:
    """Blocks in each non-free status; ``{}`` when nothing is held."""
    pools.alloc.check_integrity()
    return {k: v for k, v in pools.alloc.counts().items() if k != "free" and v}
