"""The vLLM adapter's packed layout ``[blocks, H, bs, 2*D]`` and its per-layer, per-rank
calls with a start offset (what a KV connector's save_kv_layer / start_load_kv use)."""

from __future__ import annotations

import pytest
import torch

from refimpl import read_kv, write_kv
from refimpl.adapters import (
    blocks_to_vllm,
    blocks_to_vllm_layer,
    vllm_layer_to_blocks,
    vllm_to_blocks,
)
from tests.library.lib_helpers import geo

L, H, T, D, BS = 2, 4, 11, 8, 4


def _kv() -> torch.Tensor:
    return torch.randn((L, 2, H, T, D), generator=torch.Generator().manual_seed(3))


def _packed(kv: torch.Tensor, table: list[int], blocks: int = 9) -> list[torch.Tensor]:
    """vLLM packed caches holding ``kv`` at ``table``: [blocks, H, bs, 2*D], K then V."""
    out = []
    for layer in range(kv.shape[0]):
        c = torch.zeros(blocks, kv.shape[2], BS, 2 * D)
        for j, b in enumerate(table):
            t0, t1 = j * BS, min((j + 1) * BS, T)
            c[b, :, : t1 - t0, :D] = kv[layer, 0, :, t0:t1]
            c[b, :, : t1 - t0, D:] = kv[layer, 1, :, t0:t1]
        out.append(c)
    return out


def test_packed_layout_round_trips_whole() -> None:
    kv, table = _kv(), [7, 2, 5]
    caches = _packed(kv, table)
    g = geo(tp=2, block_size=3)
    pools = g.make_pools(8)
    blocks = pools.alloc.allocate("r", g.blocks_for(T))
    vllm_to_blocks(caches, table, T, pools, "r", blocks)  # a 4-D cache is packed
    assert torch.equal(read_kv(pools, blocks, T), kv)
    out = [torch.zeros(6, H, BS, 2 * D) for _ in range(L)]
    blocks_to_vllm(pools, blocks, T, out, [4, 0, 1])
    assert all(torch.equal(o, p) for o, p in zip(out, _packed(kv, [4, 0, 1], 6), strict=True))


def test_one_layer_one_rank_at_a_time() -> None:
    """Each TP rank's connector saves its own heads, layer by layer, into its own pools."""
    kv, table, g = _kv(), [3, 1, 4], geo(tp=2, block_size=8)
    h = g.kv_heads_per_rank
    for rank in range(2):
        mine = kv[:, :, rank * h : (rank + 1) * h]
        caches = _packed(mine, table)
        pools = g.make_rank_pools(rank, 4)
        blocks = pools.alloc.allocate("r", g.blocks_for(T))
        for layer in range(L):
            vllm_layer_to_blocks(caches[layer], table, T, pools, "r", blocks, layer)
            assert torch.equal(read_kv(pools, blocks, T, layer=layer), mine[layer])
        assert torch.equal(read_kv(pools, blocks, T), mine)


@pytest.mark.parametrize("start", [0, 4, 5, 11])
def test_load_one_layer_leaves_the_held_prefix_alone(start: int) -> None:
    kv, table = _kv(), [2, 0, 5]
    g = geo(block_size=8)
    pools = g.make_pools(4)
    blocks = pools.alloc.allocate("r", g.blocks_for(T))
    write_kv(pools, "r", blocks, [list(layer) for layer in kv])
    want = _packed(kv, table, 6)
    out = [torch.full((6, H, BS, 2 * D), 7.0) for _ in range(L)]
    for layer in range(L):
        blocks_to_vllm_layer(pools, blocks, T, out[layer], table, layer, start=start)
    pos = torch.arange(T)
    phys, slot = torch.tensor(table)[pos // BS], pos % BS
    for layer in range(L):
        got = out[layer][phys, :, slot]  # [T, H, 2D]
        exp = want[layer][phys, :, slot]
        assert torch.equal(got[start:], exp[start:])
        assert bool((got[:start] == 7.0).all())  # the prefix held there is not written


def test_packed_refusals_are_named() -> None:
    pools = geo().make_pools(4)
    with pytest.raises(ValueError, match=r"packed\)"):
        vllm_to_blocks([torch.zeros(4, H, BS, 2 * D + 1)], [0, 1, 2], T, pools, "r", [0, 1, 2])
    with pytest.raises(ValueError, match="start=12"):
        blocks_to_vllm_layer(
            pools, [0, 1, 2], T, torch.zeros(4, H, BS, 2 * D), [0, 1, 2], 0, start=12
        )
    with pytest.raises(ValueError, match="layer 2"):
        read_kv(pools, [], 0, layer=2)
