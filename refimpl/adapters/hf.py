"""transformers caches <-> kvown blocks, and the geometry, identity and RoPE of a config.

    geo = KVGeometry.from_hf_config(config, tp=2, block_size=16)     # refimpl.api
    model = identity_from_hf_config(config, "my-llama")
    n = cache_to_blocks(out.past_key_values, pools, "req-1", blocks)   # prefill side
    ...                                                                 # handoff()
    cache = blocks_to_cache(pools, received.blocks, n)                  # decode side

A cache is a ``DynamicCache`` (``cache.layers[i].keys/values``, transformers >= 4.56) or
the legacy per-layer tuple ``((k, v), ...)``; each tensor is ``[batch, kv_heads, T,
head_dim]`` (after RoPE for keys). One batch row is one request. Nothing here imports
transformers at module import; ``blocks_to_cache`` does, when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from refimpl.api.geometry import ModelIdentity
from refimpl.api.tokens import read_kv, write_kv
from refimpl.engine.data import RankPools
from spec.manifest import ROPE_SCALINGS, RopeConfig

# Models whose RoPE rotates interleaved pairs; the Llama family rotates halves (neox).
GPTJ_STYLE_MODELS = frozenset({"gptj", "codegen"})

Legacy = tuple[tuple[torch.Tensor, torch.Tensor], ...]


def rope_from_hf_config(config: Any) -> RopeConfig:
    """The manifest's RoPE of a transformers config (v5 ``rope_parameters`` or v4 fields)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    kind = params.get("rope_type") or params.get("type") or "default"
    scaling = "none" if kind == "default" else kind
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"rope_type {kind!r} has no manifest name; known {sorted(ROPE_SCALINGS)}")
    q_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // q_heads
    partial = params.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", 1.0)
    rotary_dim = int(head_dim * partial)
    llama3 = scaling == "llama3"
    original = params.get("original_max_position_embeddings")
    return RopeConfig(
        theta=float(params["rope_theta"]),
        rotary_dim=rotary_dim - rotary_dim % 2,
        scaling=scaling,
        scaling_factor=float(params.get("factor", 1.0)) if scaling != "none" else 1.0,
        style="gptj" if getattr(config, "model_type", "") in GPTJ_STYLE_MODELS else "neox",
        low_freq_factor=float(params["low_freq_factor"]) if llama3 else None,
        high_freq_factor=float(params["high_freq_factor"]) if llama3 else None,
        original_max_position=int(original) if original and scaling != "linear" else None,
    )


def identity_from_hf_config(
    config: Any, model_id: str, *, adapter_id: str | None = None
) -> ModelIdentity:
    """``model_id`` names the weights (a config cannot: random weights share it)."""
    return ModelIdentity(model_id, rope_from_hf_config(config), adapter_id)


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(k, v) per layer, each [batch, kv_heads, T, head_dim], of either cache form."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    if isinstance(cache, (tuple, list)) and all(len(x) == 2 for x in cache):
        return [(k, v) for k, v in cache]
    raise TypeError(f"{type(cache).__name__} is neither a DynamicCache nor ((k, v), ...)")


def cache_to_blocks(
    cache: Any, pools: RankPools, holder: str, blocks: Sequence[int], *, batch_index: int = 0
) -> int:
    """Write one batch row of ``cache`` into ``blocks`` (checked: ``holder`` writes them).

    Returns the number of tokens written.
    """
    layers = cache_layers(cache)
    fields = [[k[batch_index], v[batch_index]] for k, v in layers]  # [H, T, D] views
    write_kv(pools, holder, blocks, fields)
    return int(layers[0][0].shape[2]) if layers else 0


def blocks_to_legacy(pools: RankPools, blocks: Sequence[int], num_tokens: int) -> Legacy:
    """The tokens held in ``blocks`` as ((k, v), ...) of [1, kv_heads, T, head_dim]."""
    kv = read_kv(pools, blocks, num_tokens).unsqueeze(2)  # [L, F, 1, H, T, D]
    return tuple((kv[layer, 0], kv[layer, 1]) for layer in range(kv.shape[0]))


def blocks_to_cache(pools: RankPools, blocks: Sequence[int], num_tokens: int) -> Any:
    """The tokens held in ``blocks`` as a transformers ``DynamicCache`` (batch 1)."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=blocks_to_legacy(pools, blocks, num_tokens))
