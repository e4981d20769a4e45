"""vLLM's paged layout <-> kvown blocks.

vLLM (FlashAttention backend) keeps, per layer, one tensor

    kv_cache[layer]   [2, num_blocks, block_size, num_kv_heads, head_dim]   (K, V)

and per request a block table (logical block -> physical block of those tensors). These
helpers move one request between that and a kvown request's blocks: one gather per
(layer, field) on the way in, one ``index_copy_`` per (layer, field) on the way out. The
two sides may use different block sizes and TP (the kvown pools hold their own).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refimpl.api.tokens import read_kv, write_kv
from refimpl.engine.data import RankPools


def _check(kv_caches: Sequence[torch.Tensor], block_table: Sequence[int], num_tokens: int) -> int:
    if not kv_caches:
        raise ValueError("no layers")
    shape = kv_caches[0].shape
    if len(shape) != 5 or shape[0] != 2:
        raise ValueError(f"kv_cache of shape {tuple(shape)}; expected [2, blocks, bs, H, D]")
    bs = int(shape[2])
    if len(block_table) * bs < num_tokens:
        raise ValueError(f"{len(block_table)} blocks of {bs} cannot hold {num_tokens} tokens")
    return bs


def _tokens(cache: torch.Tensor, field: int, table: torch.Tensor, n: int) -> torch.Tensor:
    """[H, n, D] view of one field's first n tokens, gathered from the block table."""
    blocks = cache[field].index_select(0, table)  # [nb, bs, H, D]
    return blocks.flatten(0, 1)[:n].permute(1, 0, 2)


def vllm_to_blocks(
    kv_caches: Sequence[torch.Tensor],
    block_table: Sequence[int],
    num_tokens: int,
    pools: RankPools,
    holder: str,
    blocks: Sequence[int],
) -> None:
    """Write tokens [0, num_tokens) of one vLLM request into ``blocks`` (checked)."""
    bs = _check(kv_caches, block_table, num_tokens)
    need = -(-num_tokens // bs)
    table = torch.as_tensor(list(block_table[:need]), dtype=torch.long, device=kv_caches[0].device)
    fields = [
        [_tokens(c, 0, table, num_tokens), _tokens(c, 1, table, num_tokens)] for c in kv_caches
    ]
    write_kv(pools, holder, blocks, fields)


def blocks_to_vllm(
    pools: RankPools,
    blocks: Sequence[int],
    num_tokens: int,
    kv_caches: Sequence[torch.Tensor],
    block_table: Sequence[int],
) -> None:
    """Write the request held in ``blocks`` into vLLM's caches at ``block_table``."""
    bs = _check(kv_caches, block_table, num_tokens)
    kv = read_kv(pools, blocks, num_tokens)  # [L, F, H, T, D]
    if kv.shape[0] != len(kv_caches):
        raise ValueError(f"{kv.shape[0]} layers in kvown, {len(kv_caches)} vLLM caches")
    full, tail = divmod(num_tokens, bs)
    device = kv_caches[0].device
    idx = torch.as_tensor(list(block_table[:full]), dtype=torch.long, device=device)
    for layer, cache in enumerate(kv_caches):
        for f in range(2):
            tok = kv[layer, f].permute(1, 0, 2)  # [T, H, D]
            if full:
                cache[f].index_copy_(
                    0, idx, tok[: full * bs].reshape(full, bs, *tok.shape[1:]).to(device)
                )
            if tail:
                cache[f, block_table[full], :tail].copy_(tok[full * bs :])
