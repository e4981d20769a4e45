"""The KV cache layouts of vLLM's attention backends, as views in kvown's block order.

Axis letters: N blocks, L layers, K the cache fields (K and V), T a block's token slots,
H KV heads, D head dim. Per layer, the engine hands kvown one tensor per layer in the
shape its backend declares (``get_kv_cache_shape``), with strides in the order it lays
the bytes out (``get_kv_cache_stride_order``); cross-layer, one tensor for every layer,
in its byte order (what vLLM's ``register_cross_layers_kv_cache`` is given):

    name             per layer: shape   bytes          cross-layer: bytes
    flash_attn       K N T H D          K N T H D      N L K T H D
    flash_attn_hnd   K N T H D          K N H T D      N H L K T D
    flashinfer       N K T H D          N K T H D      N L K T H D
    flashinfer_hnd   N K T H D          N K H T D      N K H L T D
    flash_attn_packed      N H T 2D     N T H 2D       N L T H 2D
    flash_attn_packed_hnd  N H T 2D     N H T 2D       N H L T 2D

(the packed forms: vLLM's newer FlashAttention backend, K and V side by side in the last
axis, ``2D`` = K's head_dim values then V's).

An NHD cache's blocks are kvown's ``tokens_major`` (T before H), an HND cache's
``heads_major``; the NHD cross-layer tensor is byte for byte kvown's own tokens_major
pool. ``layer_view``/``cross_view`` permute (never copy) the engine's tensor to kvown's
``[N, K, a, b, D]`` per layer (``[N, L, K, a, b, D]`` cross-layer), and refuse, naming
what is wrong, a tensor whose rank, fields or byte order is not the layout's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec.shardmap import LAYOUTS as KV_LAYOUTS  # ("heads_major", "tokens_major")


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    shape: str  # per-layer tensor's shape, as the backend declares it
    order: str  # per-layer tensor's byte order
    cross: str  # the cross-layer tensor's shape (= its byte order)
    packed: bool = False  # K and V side by side in the last axis (its size 2 * D)

    @property
    def kv_layout(self) -> str:
        """kvown's block layout of this cache: tokens_major for NHD, heads_major for HND."""
        return KV_LAYOUTS[1] if self.order.index("T") < self.order.index("H") else KV_LAYOUTS[0]

    def kvown_axes(self, cross: bool) -> str:
        inner = "THD" if self.kv_layout == KV_LAYOUTS[1] else "HTD"
        return ("NLK" if cross else "NK") + inner


LAYOUTS: dict[str, Layout] = {
    lay.name: lay
    for lay in (
        Layout("flash_attn", "KNTHD", "KNTHD", "NLKTHD"),
        Layout("flash_attn_hnd", "KNTHD", "KNHTD", "NHLKTD"),
        Layout("flashinfer", "NKTHD", "NKTHD", "NLKTHD"),
        Layout("flashinfer_hnd", "NKTHD", "NKHTD", "NKHLTD"),
        Layout("flash_attn_packed", "NHTKD", "NTHKD", "NLTHKD", packed=True),
        Layout("flash_attn_packed_hnd", "NHTKD", "NHTKD", "NHLTKD", packed=True),
    )
}


def layout(name: object) -> Layout:
    if not isinstance(name, str) or name not in LAYOUTS:
        raise ValueError(f"layout {name!r:.60}: not one of {sorted(LAYOUTS)}")
    return LAYOUTS[name]


def _byte_order(t: torch.Tensor, axes: str) -> str:
    """The axes of ``t`` (named ``axes``), outermost byte stride first (size-1 axes kept
    where they are named)."""
    strides: list[int] = [t.stride(i) for i in range(t.dim())]
    ranked = sorted(range(t.dim()), key=lambda i: (-strides[i], i))
    return "".join(axes[i] for i in ranked)


def _dims(t: torch.Tensor, axes: str) -> dict[str, int]:
    return dict(zip(axes, t.shape, strict=True))


def _unpack(t: object, lay: Layout, what: str) -> object:
    """A packed layout's tensor with its last axis (K and V side by side) split in two."""
    if not lay.packed or not isinstance(t, torch.Tensor) or t.dim() < 1:
        return t
    if t.shape[-1] % 2 or t.stride(-1) != 1:
        raise ValueError(
            f"{what}: {lay.name} packs K and V in the last axis (2 * head_dim, contiguous); "
            f"shape {tuple(t.shape)}, strides {t.stride()}"
        )
    return t.view(*t.shape[:-1], 2, t.shape[-1] // 2)


def _shaped(t: object, lay: Layout, axes: str, kind: str, what: str) -> torch.Tensor:
    """``t`` unpacked, checked to be a ``len(axes)``-d tensor with K = 2 fields (K and V)."""
    t = _unpack(t, lay, what)
    if not isinstance(t, torch.Tensor) or t.dim() != len(axes):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(
            f"{what}: {got!r:.60} is not a {len(axes)}-d {kind} cache [{', '.join(axes)}]"
        )
    if (k := _dims(t, axes)["K"]) != 2:
        raise ValueError(
            f"{what}: shape {tuple(t.shape)}: a {kind} cache is [{', '.join(axes)}]"
            f" with K = 2 fields (K and V), got {k}"
        )
    return t


def layer_view(t: torch.Tensor, lay: Layout, what: str) -> torch.Tensor:
    """One layer's tensor (shape ``lay.shape``, bytes ``lay.order``) as ``[N, K, a, b, D]``
    in kvown's block order (a view)."""
    t = _shaped(t, lay, lay.shape, lay.name, what)
    _check_order(t, lay.shape, lay.order, what, lay.name)
    target = lay.kvown_axes(cross=False)
    return t.permute([lay.shape.index(c) for c in target])


def cross_view(t: torch.Tensor, lay: Layout, what: str) -> torch.Tensor:
    """The cross-layer tensor (shape and bytes ``lay.cross``) as ``[N, L, K, a, b, D]`` in
    kvown's block order (a view)."""
    t = _shaped(t, lay, lay.cross, f"cross-layer {lay.name}", what)
    if not t.is_contiguous():
        raise ValueError(
            f"{what}: a cross-layer cache is one allocation in its byte order "
            f"[{', '.join(lay.cross)}]; this tensor is not contiguous "
            f"(strides {t.stride()})"
        )
    target = lay.kvown_axes(cross=True)
    return t.permute([lay.cross.index(c) for c in target])


def _check_order(t: torch.Tensor, shape: str, order: str, what: str, name: str) -> None:
    """Refuse a tensor whose bytes within a block are not laid out as the layout says:
    the axes after N in ``order`` densely packed, outermost first (the block axis and an
    axis before it, FlashAttention's K, may have any stride)."""
    dims, inner = _dims(t, shape), order[order.index("N") + 1 :]
    want, step = {}, 1
    for c in reversed(inner):
        want[c], step = step, step * dims[c]
    if any(t.stride(shape.index(c)) != want[c] for c in inner if dims[c] > 1):
        raise ValueError(
            f"{what}: {name} lays out bytes as [{', '.join(order)}], but this tensor's "
            f"strides {t.stride()} over [{', '.join(shape)}] put them as "
            f"[{', '.join(_byte_order(t, shape))}]"
        )
