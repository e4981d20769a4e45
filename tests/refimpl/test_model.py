"""Decode after a handoff (reshard, block size, layout) equals decode with no handoff."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from refimpl.model import (
    ContiguousKV,
    PagedKV,
    RopeConfig,
    TinyConfig,
    TinyDecoder,
    apply_rope,
    decode,
    generate,
)
from refimpl.reshard import reshard
from spec.manifest import RopeConfig as SpecRopeConfig
from spec.manifest import rope_reasons

PROMPT_LEN, STEPS = 13, 6


def _prompt(cfg: TinyConfig, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (PROMPT_LEN,), generator=g)  # (T,)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layout", ["heads_major", "tokens_major"])
def test_paged_decode_equals_unpaged_reference(dtype: str, layout: str) -> None:
    cfg = TinyConfig(dtype=dtype)
    model = TinyDecoder(cfg, seed=1)
    ref = generate(model, _prompt(cfg), STEPS)
    paged = generate(model, _prompt(cfg), STEPS, PagedKV.empty(cfg, layout, 4, 32))
    assert torch.equal(paged.prefill_logits, ref.prefill_logits)
    assert torch.equal(paged.decode_logits, ref.decode_logits)
    assert paged.tokens == ref.tokens
    assert len(set(ref.tokens)) > 1  # the run is not degenerate


HANDOFFS = {
    # name: (kv_heads, (tp, cp, layout, block_size) prefill, (tp, layout, block_size) decode)
    "tp2->tp1": (2, (2, 1, "heads_major", 4), (1, "heads_major", 4)),
    "tp1->tp2": (2, (1, 1, "heads_major", 4), (2, "heads_major", 4)),
    "tp4->tp2": (4, (4, 1, "heads_major", 4), (2, "heads_major", 4)),
    "tp4->tp2 replicated": (2, (4, 1, "heads_major", 4), (2, "heads_major", 4)),
    "tp2->tp8 replicated": (2, (2, 1, "heads_major", 4), (8, "heads_major", 4)),
    "block size 4->16, layout": (2, (2, 1, "tokens_major", 4), (1, "heads_major", 16)),
    "block size 5->3": (4, (1, 1, "heads_major", 5), (4, "tokens_major", 3)),
    "tp2 cp3->tp1": (2, (2, 3, "heads_major", 2), (1, "tokens_major", 4)),
}


@pytest.mark.parametrize("name", sorted(HANDOFFS))
def test_handoff_decode_is_bit_exact(name: str) -> None:
    kv_heads, (stp, scp, slayout, sbs), (dtp, dlayout, dbs) = HANDOFFS[name]
    cfg = TinyConfig(kv_heads=kv_heads)
    model = TinyDecoder(cfg, seed=2)
    prompt = _prompt(cfg, seed=3)
    ref = generate(model, prompt, STEPS)

    prefill_kv = PagedKV.empty(cfg, slayout, sbs, PROMPT_LEN, tp=stp, cp=scp)
    logits = model.prefill(prompt, prefill_kv)  # (T, V)
    decode_kv = PagedKV.empty(cfg, dlayout, dbs, PROMPT_LEN + STEPS, tp=dtp)
    reshard(prefill_kv.kv, decode_kv.kv)
    rows, tokens = decode(model, int(logits[-1].argmax()), PROMPT_LEN, STEPS, decode_kv)

    assert torch.equal(logits, ref.prefill_logits)
    assert torch.equal(rows, ref.decode_logits)
    assert tokens == ref.tokens


def test_suffix_only_handoff_with_prefix_present() -> None:
    cfg = TinyConfig()
    model = TinyDecoder(cfg, seed=4)
    prompt = _prompt(cfg, seed=5)
    ref = generate(model, prompt, STEPS)
    prefill_kv = PagedKV.empty(cfg, "heads_major", 4, PROMPT_LEN, tp=2)
    logits = model.prefill(prompt, prefill_kv)
    decode_kv = PagedKV.empty(cfg, "heads_major", 4, PROMPT_LEN + STEPS, tp=1)
    reshard(prefill_kv.kv, decode_kv.kv, stop=8)  # the prefix the decode side already had
    sent = reshard(prefill_kv.kv, decode_kv.kv, start=8)  # only the suffix travels
    rows, _ = decode(model, int(logits[-1].argmax()), PROMPT_LEN, STEPS, decode_kv)
    assert torch.equal(rows, ref.decode_logits)
    assert sent.bytes_moved == cfg.layers * 2 * cfg.kv_heads * (PROMPT_LEN - 8) * 8 * 8


def test_one_corrupted_element_changes_the_logits() -> None:
    cfg = TinyConfig()
    model = TinyDecoder(cfg, seed=2)
    prompt = _prompt(cfg, seed=3)
    ref = generate(model, prompt, STEPS)
    kv = PagedKV.empty(cfg, "heads_major", 4, PROMPT_LEN + STEPS)
    logits = model.prefill(prompt, kv)
    kv.kv.pools[0][0][1, 1, 1, 0, 2, 3] += 1e-9  # token 6 (block 1 slot 2), layer 1, V, dim 3
    rows, _ = decode(model, int(logits[-1].argmax()), PROMPT_LEN, STEPS, kv)
    assert not torch.equal(rows, ref.decode_logits)


def test_wrong_rope_base_gives_visibly_different_logits() -> None:
    cfg = TinyConfig()
    model = TinyDecoder(cfg, seed=2)
    wrong = TinyDecoder(replace(cfg, rope=RopeConfig(500000.0, 8)), seed=2)
    assert torch.equal(wrong.blocks[0].wk, model.blocks[0].wk)  # same weights, other RoPE
    prompt = _prompt(cfg, seed=3)
    ref = generate(model, prompt, STEPS)
    kv = ContiguousKV(cfg)
    logits = model.prefill(prompt, kv)  # KV written under theta=10000
    rows, _ = decode(wrong, int(logits[-1].argmax()), PROMPT_LEN, STEPS, kv)
    assert (rows - ref.decode_logits).abs().max() > 0.2


def test_rope_config_goes_into_a_manifest() -> None:
    assert RopeConfig is SpecRopeConfig  # one RoPE type: the manifest's
    rope = RopeConfig(theta=1e6, rotary_dim=4, style="gptj")
    assert rope_reasons(rope.to_json_dict()) == []
    with pytest.raises(ValueError, match="rotary_dim=6 must be even and in"):
        TinyConfig(head_dim=4, rope=RopeConfig(10000.0, 6))
    with pytest.raises(ValueError, match="q_heads=8 is not a multiple of kv_heads=3"):
        TinyConfig(kv_heads=3)


def test_partial_rotary_dim_leaves_the_tail_unrotated() -> None:
    cfg = TinyConfig(rope=RopeConfig(10000.0, 4))
    model = TinyDecoder(cfg, seed=1)
    kv = ContiguousKV(cfg)
    model.prefill(_prompt(cfg), kv)
    k_rot = kv.k[0]  # (H, T, hs), after RoPE
    kv0 = ContiguousKV(replace(cfg, rope=RopeConfig(theta=3.0, rotary_dim=4)))
    TinyDecoder(replace(cfg, rope=RopeConfig(theta=3.0, rotary_dim=4)), seed=1).prefill(
        _prompt(cfg), kv0
    )
    assert torch.equal(kv0.k[0][..., 4:], k_rot[..., 4:])  # unrotated tail agrees
    assert not torch.equal(kv0.k[0][..., :4], k_rot[..., :4])


def test_rope_styles_pair_different_dims() -> None:
    """neox rotates (x[i], x[i + rd/2]); gptj rotates (x[2i], x[2i + 1])."""
    x = torch.arange(1.0, 5.0, dtype=torch.float64).view(1, 1, 4)  # (nh, T, hs)
    angles = torch.tensor([[0.5, 0.25]], dtype=torch.float64)  # (T, rd/2)
    c, s = angles.cos()[0], angles.sin()[0]
    neox = torch.stack((1 * c[0] - 3 * s[0], 2 * c[1] - 4 * s[1], 3 * c[0] + 1 * s[0],
                        4 * c[1] + 2 * s[1]))  # fmt: skip
    gptj = torch.stack((1 * c[0] - 2 * s[0], 2 * c[0] + 1 * s[0], 3 * c[1] - 4 * s[1],
                        4 * c[1] + 3 * s[1]))  # fmt: skip
    assert torch.allclose(apply_rope(x, angles, "neox")[0, 0], neox)
    assert torch.allclose(apply_rope(x, angles, "gptj")[0, 0], gptj)
    with pytest.raises(ValueError, match="scaling 'llama3': implemented only for"):
        TinyConfig(rope=RopeConfig(1e4, 8, "llama3", 8.0, "neox", 1.0, 4.0, 8192))
