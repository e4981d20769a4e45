"""Cache adapters: transformers, vLLM and SGLang layouts <-> kvown blocks, bit-exact."""

from __future__ import annotations

import pytest
import torch

from refimpl import KVGeometry, read_kv
from refimpl.adapters import (
    blocks_to_cache,
    blocks_to_legacy,
    blocks_to_sglang,
    blocks_to_vllm,
    cache_layers,
    cache_to_blocks,
    rope_from_hf_config,
    sglang_to_blocks,
    vllm_to_blocks,
)
from refimpl.errors import FrozenError, OwnerError
from tests.library.lib_helpers import geo

transformers = pytest.importorskip("transformers")


def _kv(layers: int = 2, heads: int = 4, tokens: int = 11, dim: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn((layers, 2, heads, tokens, dim), generator=g)  # [L, F, H, T, D]


def _llama(**kw: object):  # type: ignore[no-untyped-def]
    base = dict(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=8, num_key_value_heads=2)  # fmt: skip
    return transformers.LlamaConfig(**{**base, **kw})


def test_geometry_and_rope_from_a_llama_config() -> None:
    g = KVGeometry.from_hf_config(_llama(), tp=2, block_size=8, dtype=torch.bfloat16)
    assert (g.num_layers, g.kv_heads, g.kv_heads_per_rank, g.head_dim) == (3, 2, 1, 8)
    assert (g.dtype, g.block_size, g.tp) == ("bfloat16", 8, 2)
    rope = rope_from_hf_config(_llama())
    assert (rope.theta, rope.rotary_dim, rope.style, rope.scaling) == (10000.0, 8, "neox", "none")
    scaled = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 1024,
              "rope_theta": 500000.0}  # fmt: skip
    rope = rope_from_hf_config(_llama(rope_parameters=scaled))
    assert (rope.scaling, rope.scaling_factor, rope.low_freq_factor) == ("llama3", 8.0, 1.0)
    assert (rope.high_freq_factor, rope.original_max_position, rope.theta) == (4.0, 1024, 5e5)


@pytest.mark.parametrize("kw", [{}, {"tp": 2, "layout": "tokens_major", "block_size": 3}])
def test_hf_cache_round_trips_through_blocks(kw: dict[str, object]) -> None:
    kv = _kv()
    g = geo(**kw)
    pools = g.make_pools(8)
    blocks = pools.alloc.allocate("r", g.blocks_for(11) + 1)[::-1]  # not in id order
    legacy = tuple((kv[i, 0].unsqueeze(0), kv[i, 1].unsqueeze(0)) for i in range(2))
    assert cache_to_blocks(legacy, pools, "r", blocks) == 11
    assert torch.equal(read_kv(pools, blocks, 11), kv)
    cache = blocks_to_cache(pools, blocks, 11)
    assert isinstance(cache, transformers.DynamicCache) and cache.get_seq_length() == 11
    for (k, v), (k0, v0) in zip(cache_layers(cache), legacy, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert torch.equal(blocks_to_legacy(pools, blocks, 5)[1][0], legacy[1][0][:, :, :5])


def test_writes_ask_the_allocator() -> None:
    pools = geo().make_pools(4)
    blocks = pools.alloc.allocate("r", 3)
    legacy = tuple((k.unsqueeze(0), v.unsqueeze(0)) for k, v in _kv())
    with pytest.raises(OwnerError):
        cache_to_blocks(legacy, pools, "someone-else", blocks)
    pools.alloc.incref("pin", blocks)
    with pytest.raises(FrozenError):
        cache_to_blocks(legacy, pools, "r", blocks)
    assert torch.count_nonzero(pools.pools[0].kv) == 0  # nothing written


def test_vllm_paged_layout_round_trips_with_block_tables() -> None:
    kv = _kv()  # 11 tokens
    caches = [torch.zeros(2, 9, 4, 4, 8) for _ in range(2)]  # vLLM block size 4
    table = [7, 2, 5]
    for layer in range(2):
        for f in range(2):
            tok = torch.zeros(12, 4, 8)
            tok[:11] = kv[layer, f].permute(1, 0, 2)
            caches[layer][f, table] = tok.view(3, 4, 4, 8)
    g = geo(tp=2, block_size=3, layout="tokens_major")
    pools = g.make_pools(8)
    blocks = pools.alloc.allocate("r", g.blocks_for(11))
    vllm_to_blocks(caches, table, 11, pools, "r", blocks)
    assert torch.equal(read_kv(pools, blocks, 11), kv)
    out = [torch.zeros(2, 6, 4, 4, 8) for _ in range(2)]
    blocks_to_vllm(pools, blocks, 11, out, [4, 0, 1])
    for layer in range(2):
        assert torch.equal(out[layer][:, [4, 0]], caches[layer][:, [7, 2]])
        assert torch.equal(out[layer][:, 1, :3], caches[layer][:, 5, :3])


def test_sglang_token_pool_round_trips_through_any_slots() -> None:
    kv = _kv()
    slots = torch.randperm(32, generator=torch.Generator().manual_seed(3))[:11]
    k_buf = [torch.zeros(32, 4, 8) for _ in range(2)]
    v_buf = [torch.zeros(32, 4, 8) for _ in range(2)]
    for layer in range(2):
        k_buf[layer][slots] = kv[layer, 0].permute(1, 0, 2)
        v_buf[layer][slots] = kv[layer, 1].permute(1, 0, 2)
    g = geo(block_size=5)
    pools = g.make_pools(8)
    blocks = pools.alloc.allocate("r", 3)
    sglang_to_blocks(k_buf, v_buf, slots, pools, "r", blocks)
    assert torch.equal(read_kv(pools, blocks, 11), kv)
    k2, v2 = [torch.zeros(16, 4, 8) for _ in range(2)], [torch.zeros(16, 4, 8) for _ in range(2)]
    blocks_to_sglang(pools, blocks, k2, v2, list(range(5, 16)))
    assert torch.equal(k2[1][5:16], kv[1, 0].permute(1, 0, 2))
    assert torch.equal(v2[0][5:16], kv[0, 1].permute(1, 0, 2))
