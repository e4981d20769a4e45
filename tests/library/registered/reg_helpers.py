"""Engine-side caches for the registered-memory tests, built and read without kvown.

Each layout's tensors are made as vLLM's backends make them (the per-layer tensor in the
backend's declared shape with strides in its byte order; the cross-layer tensor in its
byte order), and ``engine_block`` reads one (layer, block) back as ``[2, T, H, D]`` by
plain indexing of the engine's tensors: the tests never read them through kvown's views.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from refimpl.api import KVGeometry, ModelIdentity
from spec.manifest import RopeConfig

MODEL = ModelIdentity("reg-test", RopeConfig(10000.0, 8))
L, H, D, BS, N = 3, 4, 8, 4, 12
SENTINEL = 7.0


@dataclass(frozen=True)
class Kind:
    """One engine layout: how to make its tensors and read one (layer, block) back."""

    name: str  # the layout name given to register_kv_caches
    cross: bool
    make: Callable[[int, int, int, int, int, torch.dtype], object]  # (L, N, T, H, D)
    read: Callable[[object, int, int], torch.Tensor]  # (caches, layer, block) -> [2,T,H,D]

    @property
    def kv_layout(self) -> str:
        return "heads_major" if self.name.endswith("hnd") else "tokens_major"

    def geometry(self, block_size: int = BS, tp: int = 1, heads: int = H) -> KVGeometry:
        return KVGeometry(L, heads, D, block_size, "float32", tp=tp, layout=self.kv_layout)

    def __str__(self) -> str:
        return f"{self.name}{'-cross' if self.cross else ''}"


def _empty(shape: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
    return torch.full(shape, SENTINEL, dtype=dt)


KINDS = [
    Kind(
        "flash_attn",
        False,
        lambda nl, n, t, h, d, dt: [_empty((2, n, t, h, d), dt) for _ in range(nl)],
        lambda c, li, b: c[li][:, b],  # type: ignore[index]
    ),
    Kind(
        "flash_attn_hnd",
        False,  # vLLM's shape [2, N, T, H, D], bytes [2, N, H, T, D]
        lambda nl, n, t, h, d, dt: [_empty((2, n, h, t, d), dt).transpose(2, 3) for _ in range(nl)],
        lambda c, li, b: c[li][:, b],  # type: ignore[index]
    ),
    Kind(
        "flashinfer",
        False,
        lambda nl, n, t, h, d, dt: [_empty((n, 2, t, h, d), dt) for _ in range(nl)],
        lambda c, li, b: c[li][b],  # type: ignore[index]
    ),
    Kind(
        "flashinfer_hnd",
        False,
        lambda nl, n, t, h, d, dt: [_empty((n, 2, h, t, d), dt).transpose(2, 3) for _ in range(nl)],
        lambda c, li, b: c[li][b],  # type: ignore[index]
    ),
    Kind(
        "flash_attn",
        True,  # [N, L, 2, T, H, D]
        lambda nl, n, t, h, d, dt: _empty((n, nl, 2, t, h, d), dt),
        lambda c, li, b: c[b, li],  # type: ignore[index]
    ),
    Kind(
        "flash_attn_hnd",
        True,  # [N, H, L, 2, T, D]
        lambda nl, n, t, h, d, dt: _empty((n, h, nl, 2, t, d), dt),
        lambda c, li, b: c[b, :, li].permute(1, 2, 0, 3),  # type: ignore[index]
    ),
    Kind(
        "flashinfer_hnd",
        True,  # [N, 2, H, L, T, D]
        lambda nl, n, t, h, d, dt: _empty((n, 2, h, nl, t, d), dt),
        lambda c, li, b: c[b, :, :, li].permute(0, 2, 1, 3),  # type: ignore[index]
    ),
    Kind(
        "flash_attn_packed",
        False,  # vLLM's shape [N, H, T, 2D], bytes [N, T, H, 2D]
        lambda nl, n, t, h, d, dt: [
            _empty((n, t, h, 2 * d), dt).transpose(1, 2) for _ in range(nl)
        ],
        lambda c, li, b: c[li][b].unflatten(-1, (2, D)).permute(2, 1, 0, 3),  # type: ignore[index]
    ),
    Kind(
        "flash_attn_packed_hnd",
        False,  # [N, H, T, 2D]
        lambda nl, n, t, h, d, dt: [_empty((n, h, t, 2 * d), dt) for _ in range(nl)],
        lambda c, li, b: c[li][b].unflatten(-1, (2, D)).permute(2, 1, 0, 3),  # type: ignore[index]
    ),
    Kind(
        "flash_attn_packed_hnd",
        True,  # [N, H, L, T, 2D]
        lambda nl, n, t, h, d, dt: _empty((n, h, nl, t, 2 * d), dt),
        lambda c, li, b: c[b, :, li].unflatten(-1, (2, D)).permute(2, 1, 0, 3),  # type: ignore[index]
    ),
]


def make(kind: Kind, n: int = N, block_size: int = BS, heads: int = H) -> object:
    return kind.make(L, n, block_size, heads, D, torch.float32)


def fill(kind: Kind, caches: object, blocks: list[int], seed: int) -> None:
    """Write random KV into ``blocks`` of every layer, as the engine's prefill would."""
    g = torch.Generator().manual_seed(seed)
    for li in range(L):
        for b in blocks:
            view = kind.read(caches, li, b)
            view.copy_(torch.randn(view.shape, generator=g))


def snapshot(kind: Kind, caches: object, n: int = N) -> list[list[torch.Tensor]]:
    """A copy of every (layer, block) as the engine sees it."""
    return [[kind.read(caches, li, b).clone() for b in range(n)] for li in range(L)]


def changed(kind: Kind, caches: object, before: list[list[torch.Tensor]]) -> list[int]:
    """The blocks whose bytes differ from ``before`` in any layer."""
    n = len(before[0])
    return [
        b
        for b in range(n)
        if any(not torch.equal(kind.read(caches, li, b), before[li][b]) for li in range(L))
    ]


def tokens_of(kind: Kind, caches: object, blocks: list[int], num_tokens: int) -> torch.Tensor:
    """The request's KV [L, 2, T, H, D] read from the engine's tensors, block by block."""
    per_layer = []
    for li in range(L):
        rows = torch.cat([kind.read(caches, li, b) for b in blocks], dim=1)  # [2, n*T, H, D]
        per_layer.append(rows[:, :num_tokens])
    return torch.stack(per_layer)
