"""MLA: a transformers DeepSeek-V3 (random weights, no hub, eager attention) caches the
compressed latent per layer (``keys``: the normalized ``kv_nope`` [1, 1, T, kv_lora_rank],
``values``: the rotated ``k_rot`` [1, 1, T, qk_rope_head_dim]), not per-head K/V. kvown
holds it as vLLM does: one cache field ``latent`` of kv_lora_rank + qk_rope_head_dim dims,
one "head" replicated over TP. Handed off (TP 1 -> 1, 2 -> 1, 1 -> 2, block size 16 -> 8),
the decode side's latent is bit-exact and greedy decoding from it gives the same tokens and
logits as decoding from the prefill cache itself."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from refimpl.adapters.hf import rope_from_hf_config
from refimpl.api import KVGeometry, ModelIdentity, Receiver, Sender, handoff, read_kv, write_kv
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import greedy, held

transformers = pytest.importorskip("transformers")

PROMPT, STEPS = 21, 6


def build() -> tuple[Any, Any]:
    cfg = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=16, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, max_position_embeddings=128, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    return cfg, transformers.DeepseekV3ForCausalLM(cfg).eval()


def latent_geometry(cfg: Any, **kw: Any) -> KVGeometry:
    width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    g = KVGeometry(cfg.num_hidden_layers, 1, width, 16, "float32", cache_fields=("latent",))
    return g.with_(**kw)


def latents(cache: Any) -> list[torch.Tensor]:
    """Per layer, the latent [1, T, kv_lora_rank + rope] (the single head first)."""
    return [torch.cat([layer.keys[0], layer.values[0]], dim=-1) for layer in cache.layers]


def cache_from_latents(kv: torch.Tensor, cfg: Any) -> Any:
    """kv: [layers, 1 field, 1 head, T, width] -> a DynamicCache of (kv_nope, k_rot)."""
    r = cfg.kv_lora_rank
    pairs = tuple((x[0, None, :, :, :r], x[0, None, :, :, r:]) for x in kv)
    return transformers.DynamicCache(ddp_cache_data=pairs)


@pytest.mark.parametrize(
    "src,dst", [({}, {}), ({"tp": 2}, {}), ({}, {"tp": 2}), ({"tp": 2}, {"block_size": 8})]
)
def test_a_deepseek_latent_cache_hands_off_bit_exact_and_decodes_the_same(
    src: dict[str, int], dst: dict[str, int]
) -> None:
    cfg, model = build()
    prompt = torch.randint(
        0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
    cache, first = out.cache, out.logits[0, -1]
    gs, gd = latent_geometry(cfg, **src), latent_geometry(cfg, **dst)
    identity = ModelIdentity("tiny-deepseek-v3", rope_from_hf_config(cfg))
    t = InProcessTransport()
    ps, pd = gs.make_pools(8), gd.make_pools(8)
    tx, rx = Sender(ps, gs, t, identity), Receiver(pd, gd, t, identity)
    blocks = ps.alloc.allocate("r", gs.blocks_for(PROMPT))
    write_kv(ps, "r", blocks, [[lat] for lat in latents(cache)])
    got = handoff(tx, rx, "r", prompt[0].tolist())
    assert got.received.manifest.cache_fields == ("latent",) and got.received.manifest.kv_heads == 1
    kv = read_kv(pd, got.received.blocks, PROMPT)
    want = torch.stack([lat[None] for lat in latents(cache)])  # [L, 1, 1, T, W]
    assert torch.equal(kv.view(torch.uint8), want.contiguous().view(torch.uint8))
    assert held(ps) == {}
    rebuilt = cache_from_latents(kv, cfg)  # before the reference decode grows ``cache``
    ref_tokens, ref_logits = greedy(model, first, cache, STEPS)
    tokens, logits = greedy(model, first, rebuilt, STEPS)
    assert tokens == ref_tokens and len(set(tokens)) > 1
    assert torch.equal(logits, ref_logits)


def test_the_comparison_sees_one_changed_latent_value() -> None:
    """The decode check has teeth: one changed latent element changes the logits."""
    cfg, model = build()
    with torch.no_grad():
        out = model(input_ids=torch.arange(PROMPT).view(1, PROMPT), use_cache=True)
    kv = torch.stack([lat[None] for lat in latents(out.cache)]).clone()
    a, b = cache_from_latents(kv, cfg), cache_from_latents(kv.clone(), cfg)
    kv2 = kv.clone()
    kv2[1, 0, 0, 3, 5] += 1e-3
    c = cache_from_latents(kv2, cfg)
    first = out.logits[0, -1]
    _, la = greedy(model, first, a, STEPS)
    _, lb = greedy(model, first, b, STEPS)
    _, lc = greedy(model, first, c, STEPS)
    assert torch.equal(la, lb) and not torch.equal(la, lc)


@pytest.mark.parametrize("src_tp,dst_tp", [(2, 1), (1, 2), (2, 2)])
def test_a_deepseek_sized_bf16_latent_reshards_bit_exact(src_tp: int, dst_tp: int) -> None:
    """DeepSeek-V3's own latent width (512 + 64 = 576) in bfloat16, replicated over TP."""
    g = KVGeometry(2, 1, 576, 16, "bfloat16", cache_fields=("latent",))
    gs, gd = g.with_(tp=src_tp), g.with_(tp=dst_tp)
    identity = ModelIdentity("deepseek-v3", rope_from_hf_config(build()[0]))
    t = InProcessTransport()
    ps, pd = gs.make_pools(4), gd.make_pools(4)
    tx, rx = Sender(ps, gs, t, identity), Receiver(pd, gd, t, identity)
    lat = torch.randn(2, 1, 1, 40, 576, generator=torch.Generator().manual_seed(src_tp)).bfloat16()
    blocks = ps.alloc.allocate("r", gs.blocks_for(40))
    write_kv(ps, "r", blocks, [list(layer) for layer in lat])
    got = handoff(tx, rx, "r", range(40))
    assert torch.equal(
        read_kv(pd, got.received.blocks, 40).view(torch.uint8), lat.view(torch.uint8)
    )
    for r in range(dst_tp):  # every rank holds the replica
        assert pd.pools[r].geometry.kv_heads == 1
