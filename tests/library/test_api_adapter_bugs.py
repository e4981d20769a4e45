"""Regressions of the cache adapters' bugs found by trying them (issue #23, item 7): a
sliding-window cache (Mistral) was written as if it held the first tokens, and a
block-first vLLM cache of exactly 2 blocks was read as K/V-first. Each failed before."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from refimpl import KVGeometry, handoff, read_kv
from refimpl.adapters import blocks_to_cache, blocks_to_vllm, cache_to_blocks, vllm_to_blocks
from tests.library.lib_helpers import geo, pair

transformers = pytest.importorskip("transformers")
PROMPT, STEPS = 10, 6


def _mistral(window: int) -> tuple[Any, Any]:
    cfg = transformers.MistralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return cfg, transformers.MistralForCausalLM(cfg).eval()


def _greedy(model: Any, logits: torch.Tensor, cache: Any) -> tuple[list[int], torch.Tensor]:
    tokens, rows = [], []
    with torch.no_grad():
        for _ in range(STEPS):
            tokens.append(int(logits.argmax()))
            out = model(input_ids=torch.tensor([tokens[-1:]]), cache=cache, use_cache=True)
            logits = out.logits[0, -1]
            rows.append(logits)
    return tokens, torch.stack(rows)


def _prefill(model: Any, cache: Any = None) -> Any:
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_ids=ids, cache=cache, use_cache=True)


def test_a_sliding_window_cache_shorter_than_the_prompt_is_refused_by_name() -> None:
    cfg, model = _mistral(window=4)
    cache = _prefill(model).cache  # transformers keeps the last 3 of 10 tokens per layer
    g = KVGeometry.from_hf_config(cfg, block_size=4)
    pools = g.make_pools(8)
    blocks = pools.alloc.allocate("r", g.blocks_for(PROMPT))
    with pytest.raises(ValueError, match=r"layer 0 is a sliding-window layer .*sliding_window=4"):
        cache_to_blocks(cache, pools, "r", blocks)
    assert torch.count_nonzero(pools.pools[0].kv) == 0  # nothing written


def test_a_sliding_window_cache_that_holds_every_token_is_taken() -> None:
    cfg, model = _mistral(window=16)  # longer than the prompt: every token is still held
    cache = _prefill(model).cache
    g = KVGeometry.from_hf_config(cfg, block_size=4)
    pools = g.make_pools(8)
    blocks = pools.alloc.allocate("r", g.blocks_for(PROMPT))
    assert cache_to_blocks(cache, pools, "r", blocks) == PROMPT


def test_a_sliding_window_model_hands_off_a_full_cache_and_decodes_the_same() -> None:
    """The way through: prefill into a plain DynamicCache (every token kept), hand it off,
    rebuild with the model's config (sliding layers again): the same tokens and logits as
    decoding from the model's own sliding-window cache."""
    cfg, model = _mistral(window=4)
    ref_out = _prefill(model)
    ref = _greedy(model, ref_out.logits[0, -1], ref_out.cache)
    out = _prefill(model, transformers.DynamicCache())
    g = KVGeometry.from_hf_config(cfg, block_size=4)
    p = pair(g.with_(tp=2), g)
    blocks = p.src.alloc.allocate("r", g.blocks_for(PROMPT))
    assert cache_to_blocks(out.cache, p.src, "r", blocks) == PROMPT
    got = handoff(p.tx, p.rx, "r", list(range(PROMPT)), decode_room=STEPS).received
    cache = blocks_to_cache(p.dst, got.blocks, PROMPT, config=cfg)
    assert [type(x).__name__ for x in cache.layers] == ["DynamicSlidingWindowLayer"] * 2
    tokens, logits = _greedy(model, out.logits[0, -1], cache)
    assert tokens == ref[0] and torch.equal(logits, ref[1])


def test_a_hybrid_legacy_cache_with_layers_of_other_lengths_is_refused_by_name() -> None:
    k = torch.zeros(1, 4, 10, 8)
    legacy = ((k, k), (k[:, :, -3:], k[:, :, -3:]))  # layer 1 kept only a window
    pools = geo().make_pools(4)
    with pytest.raises(ValueError, match="layer 1 holds 3 tokens, layer 0 holds 10"):
        cache_to_blocks(legacy, pools, "r", pools.alloc.allocate("r", 3))


# ---------------------------------------------------------------- vLLM: [nb, 2, ...] with nb = 2
def _block_first(kv: torch.Tensor, bs: int) -> list[torch.Tensor]:
    """vLLM block-first caches [2 blocks, 2 (K/V), bs, H, D] holding ``kv``'s tokens."""
    caches = []
    for layer in kv:  # [F, H, T, D]
        c = torch.zeros(2, 2, bs, *layer.shape[1:2], layer.shape[3])
        tok = layer.permute(0, 2, 1, 3)  # [F, T, H, D]
        c[0, :, :] = tok[:, :bs]
        c[1, :, : tok.shape[1] - bs] = tok[:, bs:]
        caches.append(c)
    return caches


def test_a_block_first_vllm_cache_of_two_blocks_is_not_misread() -> None:
    kv = torch.randn((2, 2, 4, 7, 8), generator=torch.Generator().manual_seed(2))
    caches = _block_first(kv, 4)  # shape [2, 2, 4, 4, 8]: K/V-first or block-first?
    g = geo(block_size=4)
    pools = g.make_pools(4)
    blocks = pools.alloc.allocate("r", 2)
    with pytest.raises(ValueError, match="ambiguous"):
        vllm_to_blocks(caches, [0, 1], 7, pools, "r", blocks)
    with pytest.raises(ValueError, match="ambiguous"):
        blocks_to_vllm(pools, blocks, 7, caches, [0, 1])
    assert torch.count_nonzero(pools.pools[0].kv) == 0
    vllm_to_blocks(caches, [0, 1], 7, pools, "r", blocks, layout="blocks_first")
    assert torch.equal(read_kv(pools, blocks, 7), kv)
    out = [torch.zeros_like(c) for c in caches]
    blocks_to_vllm(pools, blocks, 7, out, [1, 0], layout="blocks_first")
    for c, o in zip(caches, out, strict=True):
        assert torch.equal(o[1], c[0]) and torch.equal(o[0, :, :3], c[1, :, :3])


def test_a_block_first_vllm_cache_of_three_blocks_is_read_by_its_shape() -> None:
    kv = torch.randn((2, 2, 4, 7, 8), generator=torch.Generator().manual_seed(3))
    caches = [torch.cat([c, torch.zeros(1, *c.shape[1:])]) for c in _block_first(kv, 4)]
    pools = geo(block_size=4).make_pools(4)
    blocks = pools.alloc.allocate("r", 2)
    vllm_to_blocks(caches, [0, 1], 7, pools, "r", blocks)  # [3, 2, ...]: block-first
    assert torch.equal(read_kv(pools, blocks, 7), kv)
    with pytest.raises(ValueError, match="kv_first"):
        vllm_to_blocks(caches, [0, 1], 7, pools, "r", blocks, layout="kv_first")
