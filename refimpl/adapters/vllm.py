"""vLLM's paged layout <-> kvown blocks.

vLLM keeps, per layer, one tensor in one of two axis orders (``layout``):

    "kv_first"      [2, num_blocks, block_size, num_kv_heads, head_dim]   (FlashAttention)
    "blocks_first"  [num_blocks, 2, block_size, num_kv_heads, head_dim]   (FlashInfer)

``layout=None`` reads it from the shape, and refuses the one shape that fits both
(``[2, 2, ...]``: exactly 2 blocks) by name: pass ``layout`` there.

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

LAYOUTS = ("kv_first", "blocks_first")


def _check(
    kv_caches: Sequence[torch.Tensor],
    block_table: Sequence[int],
    num_tokens: int,
    layout: str | None,
) -> tuple[int, list[torch.Tensor]]:
    """The block size and every cache as a kv_first view (writes go through to it)."""
    if not kv_caches:
        raise ValueError("no layers")
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; known: {list(LAYOUTS)}")
    shape = tuple(kv_caches[0].shape)
    fits = [
        name for name, axis in zip(LAYOUTS, (0, 1), strict=True) if shape[axis : axis + 1] == (2,)
    ]
    if len(shape) != 5 or not fits or (layout is not None and layout not in fits):
        want = layout or " or ".join(LAYOUTS)
        raise ValueError(
            f"kv_cache of shape {shape} is not {want}: [2, blocks, bs, H, D] (kv_first) or "
            "[blocks, 2, bs, H, D] (blocks_first)"
        )
    if layout is None and len(fits) > 1:
        raise ValueError(
            f"kv_cache of shape {shape} is ambiguous: kv_first [2, 2 blocks, ...] or "
            "blocks_first [2 blocks, 2, ...]; pass layout='kv_first' or 'blocks_first'"
        )
    first = layout or fits[0]
    if any(tuple(c.shape) != shape for c in kv_caches):
        raise ValueError(f"layers of other shapes than {shape}")
    views = [c if first == "kv_first" else c.transpose(0, 1) for c in kv_caches]
    bs = int(shape[2])
    if len(block_table) * bs < num_tokens:
        raise ValueError(f"{len(block_table)} blocks of {bs} cannot hold {num_tokens} tokens")
    return bs, views


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
    *,
    layout: str | None = None,
) -> None:
    """Write tokens [0, num_tokens) of one vLLM request into ``blocks`` (checked)."""
    bs, kv_caches = _check(kv_caches, block_table, num_tokens, layout)
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
    *,
    layout: str | None = None,
) -> None:
    """Write the request held in ``blocks`` into vLLM's caches at ``block_table``."""
    bs, kv_caches = _check(kv_caches, block_table, num_tokens, layout)
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
