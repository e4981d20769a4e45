"""vLLM's paged layout <-> kvown blocks.

vLLM keeps, per layer, one tensor in one of these axis orders (``layout``):

    "kv_first"      [2, num_blocks, block_size, num_kv_heads, head_dim]   (FlashAttention)
    "blocks_first"  [num_blocks, 2, block_size, num_kv_heads, head_dim]   (FlashInfer)
    "packed"        [num_blocks, num_kv_heads, block_size, 2 * head_dim]  (K then V per slot)

``layout=None`` reads it from the shape (a 4-D cache is packed), and refuses the one
5-D shape that fits both (``[2, 2, ...]``: exactly 2 blocks) by name: pass ``layout``.

and per request a block table (logical block -> physical block of those tensors). These
helpers move one request between that and a kvown request's blocks: one gather per
(layer, field) on the way in, one ``index_copy_`` per (layer, field) on the way out. The
two sides may use different block sizes and TP (the kvown pools hold their own).

A KV connector works one layer at a time, on one TP rank: ``vllm_layer_to_blocks`` (from
``save_kv_layer``: the layer just computed, this rank's heads) and ``blocks_to_vllm_layer``
(from ``start_load_kv``/``wait_for_layer_load``), whose ``start`` skips the tokens the
decode side already holds (a prefix hit: those blocks are not overwritten).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refimpl.api.tokens import read_kv, write_kv, write_kv_layer
from refimpl.rankpools import RankPools

LAYOUTS = ("kv_first", "blocks_first", "packed")


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
    fits: list[str] = []
    if len(shape) == 5:
        fits = [name for name, axis in zip(LAYOUTS, (0, 1), strict=False) if shape[axis] == 2]
    elif len(shape) == 4 and shape[3] % 2 == 0:
        fits = ["packed"]
    if len(shape) not in (4, 5) or not fits or (layout is not None and layout not in fits):
        want = layout or " or ".join(LAYOUTS)
        raise ValueError(
            f"kv_cache of shape {shape} is not {want}: [2, blocks, bs, H, D] (kv_first), "
            "[blocks, 2, bs, H, D] (blocks_first) or [blocks, H, bs, 2*D] (packed)"
        )
    if layout is None and len(fits) > 1:
        raise ValueError(
            f"kv_cache of shape {shape} is ambiguous: kv_first [2, 2 blocks, ...] or "
            "blocks_first [2 blocks, 2, ...]; pass layout='kv_first' or 'blocks_first'"
        )
    first = layout or fits[0]
    if any(tuple(c.shape) != shape for c in kv_caches):
        raise ValueError(f"layers of other shapes than {shape}")
    views = [_kv_first(c, first) for c in kv_caches]
    bs = int(views[0].shape[2])
    if len(block_table) * bs < num_tokens:
        raise ValueError(f"{len(block_table)} blocks of {bs} cannot hold {num_tokens} tokens")
    return bs, views


def _kv_first(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """A [2, blocks, bs, H, D] view of one layer's cache (writes go through to it)."""
    if layout == "kv_first":
        return cache
    if layout == "blocks_first":
        return cache.transpose(0, 1)
    nb, heads, bs, d2 = cache.shape  # packed: [blocks, H, bs, 2*D], K then V
    return cache.view(nb, heads, bs, 2, d2 // 2).permute(3, 0, 2, 1, 4)


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


def vllm_layer_to_blocks(
    kv_cache: torch.Tensor,
    block_table: Sequence[int],
    num_tokens: int,
    pools: RankPools,
    holder: str,
    blocks: Sequence[int],
    layer: int,
    *,
    layout: str | None = None,
) -> None:
    """Write tokens [0, num_tokens) of one layer of one vLLM request into ``blocks``
    (``save_kv_layer``: the cache holds this rank's heads, ``pools`` are this rank's)."""
    bs, (cache,) = _check([kv_cache], block_table, num_tokens, layout)
    need = -(-num_tokens // bs)
    table = torch.as_tensor(list(block_table[:need]), dtype=torch.long, device=cache.device)
    fields = [_tokens(cache, 0, table, num_tokens), _tokens(cache, 1, table, num_tokens)]
    write_kv_layer(pools, holder, blocks, layer, fields)


def blocks_to_vllm_layer(
    pools: RankPools,
    blocks: Sequence[int],
    num_tokens: int,
    kv_cache: torch.Tensor,
    block_table: Sequence[int],
    layer: int,
    *,
    layout: str | None = None,
    start: int = 0,
) -> None:
    """Write tokens [start, num_tokens) of one layer held in ``blocks`` into vLLM's cache
    at ``block_table``; tokens before ``start`` (a prefix held there) are left as they are."""
    bs, (cache,) = _check([kv_cache], block_table, num_tokens, layout)
    if type(start) is not int or not 0 <= start <= num_tokens:
        raise ValueError(f"start={start!r} must be an int in [0, {num_tokens}]")
    kv = read_kv(pools, blocks, num_tokens, layer=layer)  # [F, H, T, D]
    pos = torch.arange(start, num_tokens, device=cache.device)
    table = torch.as_tensor(list(block_table), dtype=torch.long, device=cache.device)
    phys, slot = table[pos // bs], pos % bs
    for f in range(2):
        cache[f][phys, slot] = kv[f, :, start:].permute(1, 0, 2).to(cache.device)  # [T, H, D]
