"""One attention read over a decode replica: what a decode step computes from the KV."""

from __future__ import annotations

import torch


def attend(kv: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Layer 0's attention output for one fixed query over the replica ``kv``
    ([n, layers, 2, H, bs, D]): softmax(q K^T / sqrt(D)) V, per head."""
    n, _, _, h, bs, d = kv.shape
    k = kv[:, 0, 0].permute(1, 0, 2, 3).reshape(h, n * bs, d).float()
    v = kv[:, 0, 1].permute(1, 0, 2, 3).reshape(h, n * bs, d).float()
    q = torch.randn(h, 1, d, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1) @ v
