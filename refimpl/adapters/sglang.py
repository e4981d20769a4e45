"""SGLang's token-indexed pool <-> kvown blocks.

SGLang (``MHATokenToKVPool``) keeps, per layer, ``k_buffer[layer]`` and
``v_buffer[layer]`` of shape ``[pool_size, num_kv_heads, head_dim]``, and per request the
slot of each token (``req_to_token[req, :T]``). It has no blocks: a request's tokens may
sit in any slots. One gather (``index_select``) per (layer, field) in, one
``index_copy_`` per (layer, field) out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refimpl.api.tokens import read_kv, write_kv
from refimpl.rankpools import RankPools


def _slots(token_slots: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(token_slots, dtype=torch.long, device=device)


def sglang_to_blocks(
    k_buffers: Sequence[torch.Tensor],
    v_buffers: Sequence[torch.Tensor],
    token_slots: Sequence[int] | torch.Tensor,
    pools: RankPools,
    holder: str,
    blocks: Sequence[int],
) -> None:
    """Write the request whose token t sits in slot ``token_slots[t]`` into ``blocks``."""
    if len(k_buffers) != len(v_buffers):
        raise ValueError(f"{len(k_buffers)} K buffers, {len(v_buffers)} V buffers")
    idx = _slots(token_slots, k_buffers[0].device)
    fields = [
        [k.index_select(0, idx).permute(1, 0, 2), v.index_select(0, idx).permute(1, 0, 2)]
        for k, v in zip(k_buffers, v_buffers, strict=True)
    ]  # per layer [H, T, D] views
    write_kv(pools, holder, blocks, fields)


def blocks_to_sglang(
    pools: RankPools,
    blocks: Sequence[int],
    k_buffers: Sequence[torch.Tensor],
    v_buffers: Sequence[torch.Tensor],
    token_slots: Sequence[int] | torch.Tensor,
) -> None:
    """Write the request held in ``blocks`` into SGLang's buffers at ``token_slots``."""
    idx = _slots(token_slots, k_buffers[0].device)
    kv = read_kv(pools, blocks, int(idx.numel()))  # [L, F, H, T, D]
    for layer, (k, v) in enumerate(zip(k_buffers, v_buffers, strict=True)):
        k.index_copy_(0, idx, kv[layer, 0].permute(1, 0, 2).to(k.device))
        v.index_copy_(0, idx, kv[layer, 1].permute(1, 0, 2).to(v.device))
