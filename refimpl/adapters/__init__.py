"""Adapters between engines' cache layouts and kvown blocks (batched tensor copies).

``hf``: transformers ``DynamicCache`` and legacy ``((k, v), ...)`` tuples (a layer that
dropped tokens, as a sliding window does, is refused by name), plus the
geometry, identity and RoPE of a transformers config (``KVGeometry.from_hf_config``).
``vllm``: the paged ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` per layer
(or block-first ``[num_blocks, 2, ...]``; ``layout=`` where the shape fits both; or
packed ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]``), with block tables, whole
or one layer and one rank at a time (a KV connector), with a start offset for a prefix.
``sglang``: the token-indexed ``k_buffer``/``v_buffer`` per layer.
Each moves one request between the engine's tensors and a kvown request's blocks; the
handoff itself is ``refimpl.api.handoff``.
"""

from refimpl.adapters.hf import (
    blocks_to_cache,
    blocks_to_legacy,
    cache_layers,
    cache_to_blocks,
    identity_from_hf_config,
    rope_from_hf_config,
)
from refimpl.adapters.sglang import blocks_to_sglang, sglang_to_blocks
from refimpl.adapters.vllm import (
    blocks_to_vllm,
    blocks_to_vllm_layer,
    vllm_layer_to_blocks,
    vllm_to_blocks,
)

__all__ = [
    "blocks_to_cache",
    "blocks_to_legacy",
    "blocks_to_sglang",
    "blocks_to_vllm",
    "blocks_to_vllm_layer",
    "cache_layers",
    "cache_to_blocks",
    "identity_from_hf_config",
    "rope_from_hf_config",
    "sglang_to_blocks",
    "vllm_layer_to_blocks",
    "vllm_to_blocks",
]
