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

kvown blocks hold a request's tokens from the first, so every layer must hold all of
them. A sliding-window layer (``DynamicSlidingWindowLayer``: Mistral, or the sliding
layers of a hybrid model) keeps only the last ``sliding_window - 1`` tokens once the
prompt is longer: ``cache_to_blocks`` refuses it by name (as any layer holding fewer or
other tokens than it has seen, or layers of different lengths). Prefill into a plain
``DynamicCache()`` to keep every token, and rebuild the decode side's cache with
``blocks_to_cache(..., config=config)``: its sliding layers keep their window again,
and decoding is the same as from the model's own sliding-window cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from refimpl.api.geometry import ModelIdentity
from refimpl.api.tokens import read_kv, write_kv
from refimpl.rankpools import RankPools
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
    """(k, v) per layer, each [batch, kv_heads, T, head_dim], of either cache form.

    Raises ValueError naming the layer unless every layer holds every token it has seen,
    tokens 0 .. T-1 (see the module docstring on sliding-window and hybrid caches)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        out = [(layer.keys, layer.values) for layer in layers]
        for i, layer in enumerate(layers):
            _check_layer(i, layer)
    elif isinstance(cache, (tuple, list)) and all(len(x) == 2 for x in cache):
        out = [(k, v) for k, v in cache]
    else:
        raise TypeError(f"{type(cache).__name__} is neither a DynamicCache nor ((k, v), ...)")
    for i, (k, v) in enumerate(out):
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise ValueError(f"layer {i} holds no KV tensors ({type(k).__name__})")
        n, n0 = int(k.shape[-2]), int(out[0][0].shape[-2])
        if n != n0 or int(v.shape[-2]) != n:
            raise ValueError(
                f"layer {i} holds {n} tokens, layer 0 holds {n0}: a hybrid or sliding-window "
                "cache; kvown blocks need every token of every layer"
            )
    return out


def _check_layer(i: int, layer: Any) -> None:
    """Refuse a cache layer that holds fewer (or other) tokens than it has seen."""
    keys, seen = getattr(layer, "keys", None), getattr(layer, "get_seq_length", None)
    if not isinstance(keys, torch.Tensor) or seen is None:
        return  # no tensors: reported by the caller
    held, total = int(keys.shape[-2]), int(seen())
    if held == total:
        return
    name = type(layer).__name__
    if getattr(layer, "is_sliding", False):
        window = getattr(layer, "sliding_window", None) or getattr(layer, "max_cache_len", "?")
        raise ValueError(
            f"layer {i} is a sliding-window layer ({name}, sliding_window={window}): it holds "
            f"the last {held} of {total} tokens, and kvown blocks hold a request from its "
            "first token; prefill into a plain DynamicCache() to keep every token, and "
            "rebuild with blocks_to_cache(..., config=config)"
        )
    raise ValueError(f"layer {i} ({name}) holds {held} token slots for {total} tokens seen")


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


def blocks_to_cache(
    pools: RankPools, blocks: Sequence[int], num_tokens: int, *, config: Any = None
) -> Any:
    """The tokens held in ``blocks`` as a transformers ``DynamicCache`` (batch 1).

    ``config``: the model's config, so that its sliding-window layers are sliding again
    (they keep their window of the tokens given); default: every layer keeps every token.
    """
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=blocks_to_legacy(pools, blocks, num_tokens), config=config)
