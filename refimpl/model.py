"""A tiny GQA + RoPE decoder whose attention reads K/V through paged, TP-sharded pools.

System.  Two (or more) pre-norm transformer layers with grouped-query attention
(q_heads != kv_heads), rotary position embedding and a SiLU MLP; random weights from a seed.
K (after RoPE) and V are written into a `KVStore` and read back for attention:
`PagedKV` keeps them in per-TP-rank paged pools (refimpl/reshard.py), `ContiguousKV` in one
unpaged tensor per layer (the no-handoff reference).

Bit-exactness.  A handoff (prefill on TP=a, reshard, decode on TP=b, other block size or
layout) must give logits `torch.equal` to the reference.  That holds because:
  * every head's attention is one `_head_attention` call on contiguous (T, hs) K and V,
    whatever rank or store served them, so the floating-point operations are the same;
  * the projections (q, k, v, o, MLP) are computed unsplit, as if all-gathered.  A real TP
    engine splits o_proj by rows and all-reduces the partial sums; the sum order then
    depends on TP, and TP=2 vs TP=1 logits differ in the last bits.  Keeping o_proj whole
    isolates what this project checks: that KV ownership moves preserve every element.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F

from refimpl.reshard import KVLayout, ShardedKV, allocate, read_tokens, write_tokens
from spec import shardmap as sm
from spec.manifest import RopeConfig as RopeConfig  # the one RoPE type, re-exported

DTYPES = {"float32": torch.float32, "float64": torch.float64}


# The one RoPE type is the manifest's (spec.manifest.RopeConfig); this model implements
# both styles and the scalings "none" and "linear".
ROPE_SCALINGS_IMPLEMENTED = ("none", "linear")


@dataclass(frozen=True, slots=True)
class TinyConfig:
    vocab: int = 96  # token ids [0, vocab)
    layers: int = 2  # transformer layers
    q_heads: int = 8  # query heads
    kv_heads: int = 2  # KV heads; q_heads // kv_heads queries share one (GQA)
    head_dim: int = 8  # hs
    ffn: int = 128  # MLP hidden width
    rope: RopeConfig = field(default_factory=lambda: RopeConfig(10000.0, 8))
    dtype: str = "float64"  # "float32" or "float64", on CPU

    def __post_init__(self) -> None:
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"q_heads={self.q_heads} is not a multiple of kv_heads={self.kv_heads}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; expected one of {sorted(DTYPES)}")
        rd = self.rope.rotary_dim
        if rd % 2 or not 0 < rd <= self.head_dim:
            raise ValueError(f"rotary_dim={rd} must be even and in (0, head_dim={self.head_dim}]")
        if self.rope.scaling not in ROPE_SCALINGS_IMPLEMENTED:
            raise ValueError(f"rope scaling {self.rope.scaling!r}: implemented only for "
                             f"{ROPE_SCALINGS_IMPLEMENTED}")  # fmt: skip

    @property
    def d_model(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def kv_layout(self, layout: str, block_size: int, tp: int = 1, cp: int = 1) -> KVLayout:
        return KVLayout(layout, self.layers, self.kv_heads, block_size, self.head_dim, tp, cp)


class KVStore(Protocol):
    """Where attention keeps K/V.  `tp` ranks serve heads; rank r holds tp_heads(.., r)."""

    @property
    def tp(self) -> int: ...

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (kv_heads, T, hs) for global positions [start, start+T)."""

    def read(self, layer: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of every position so far for rank's heads: (h_local, S, hs), contiguous."""
        ...


class ContiguousKV:
    """The no-paging reference: one growing (kv_heads, S, hs) tensor per layer for K and V."""

    tp = 1

    def __init__(self, cfg: TinyConfig) -> None:
        empty = torch.empty(cfg.kv_heads, 0, cfg.head_dim, dtype=cfg.torch_dtype)
        self.k = [empty] * cfg.layers  # per layer (H, S, hs)
        self.v = [empty] * cfg.layers  # per layer (H, S, hs)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if start != self.k[layer].shape[1]:
            raise ValueError(f"layer {layer}: append at {start}, have {self.k[layer].shape[1]}")
        self.k[layer] = torch.cat((self.k[layer], k), dim=1)  # (H, S+T, hs)
        self.v[layer] = torch.cat((self.v[layer], v), dim=1)  # (H, S+T, hs)

    def read(self, layer: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]


class PagedKV:
    """K/V in per-TP-rank (and per-CP-rank) paged pools, addressed through block tables."""

    def __init__(self, kv: ShardedKV) -> None:
        self.kv = kv

    @classmethod
    def empty(
        cls, cfg: TinyConfig, layout: str, block_size: int, capacity: int, tp: int = 1, cp: int = 1
    ) -> PagedKV:
        """Pools with room for `capacity` tokens (for cp > 1, exactly `capacity` tokens)."""
        decl = cfg.kv_layout(layout, block_size, tp, cp)
        return cls(allocate(decl, capacity, dtype=cfg.torch_dtype))

    @property
    def tp(self) -> int:
        return self.kv.decl.tp

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        write_tokens(self.kv, layer, start, k, v)

    def read(self, layer: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return read_tokens(self.kv, rank, layer)


def rope_angles(rope: RopeConfig, start: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rotation angles of positions [start, start+n): (n, rotary_dim // 2)."""
    half = torch.arange(0, rope.rotary_dim, 2, dtype=dtype) / rope.rotary_dim  # (rd/2,)
    inv_freq = 1.0 / (rope.theta**half)  # (rd/2,)
    pos = torch.arange(start, start + n, dtype=dtype)  # (n,)
    if rope.scaling == "linear":
        pos = pos / rope.scaling_factor  # positions interpolated into the trained range
    return torch.outer(pos, inv_freq)  # (n, rd/2)


def apply_rope(x: torch.Tensor, angles: torch.Tensor, style: str = "neox") -> torch.Tensor:
    """Rotate the first rotary_dim elements.  x: (nh, T, hs).

    neox pairs x[i] with x[i + rd/2] (rotate-half); gptj pairs x[2i] with x[2i + 1].
    """
    rd = 2 * angles.shape[1]
    cos, sin = angles.cos(), angles.sin()  # (T, rd/2) each
    if style == "gptj":
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]  # (nh, T, rd/2) each
        pairs = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        rotated = pairs.flatten(-2)  # (nh, T, rd), interleaved back
    else:
        x1, x2 = x[..., : rd // 2], x[..., rd // 2 : rd]  # (nh, T, rd/2) each
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (nh, T, rd)
    return torch.cat((rotated, x[..., rd:]), dim=-1)  # (nh, T, hs)


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # (T, C)


def _head_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """One query head.  q: (T, hs); k, v: (S, hs), contiguous; mask: (T, S) additive."""
    scores = q @ k.transpose(0, 1) / math.sqrt(q.shape[-1]) + mask  # (T, S)
    return torch.softmax(scores, dim=-1) @ v  # (T, hs)


def attention_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, kv_of: Sequence[int]
) -> torch.Tensor:
    """One TP rank's attention: q (nq_local, T, hs) over its KV heads k, v (h_local, S,
    hs); q head i reads local KV head ``kv_of[i]`` -> (nq_local, T, hs). The same
    arithmetic wherever the rank runs (here, or a decode rank in a process of its own)."""
    out = torch.empty_like(q)
    for i, j in enumerate(kv_of):
        out[i] = _head_attention(q[i], k[j], v[j], mask)  # (T, hs)
    return out


def rank_kv_of(cfg: TinyConfig, tp: int, rank: int) -> list[int]:
    """TP rank ``rank``'s q heads' local KV head indices (GQA: ``q // group``)."""
    group, local = cfg.q_heads // cfg.kv_heads, sm.tp_heads(cfg.kv_heads, tp, rank)
    return [qh // group - local.start for qh in sm.tp_q_heads(cfg.q_heads, cfg.kv_heads, tp, rank)]


class _Layer(NamedTuple):
    ln1: torch.Tensor  # (C,)
    wq: torch.Tensor  # (C, nq*hs)
    wk: torch.Tensor  # (C, nkv*hs)
    wv: torch.Tensor  # (C, nkv*hs)
    wo: torch.Tensor  # (nq*hs, C)
    ln2: torch.Tensor  # (C,)
    w1: torch.Tensor  # (C, F)
    w2: torch.Tensor  # (F, C)


class TinyDecoder:
    """Random-weight decoder; the same seed gives the same weights whatever the RoPE config."""

    def __init__(self, cfg: TinyConfig, seed: int = 0) -> None:
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)
        C, dt = cfg.d_model, cfg.torch_dtype

        def rand(*shape: int, scale: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dt)

        def norm_w() -> torch.Tensor:
            return (1.0 + 0.1 * torch.randn(C, generator=g, dtype=torch.float64)).to(dt)

        kv_w = cfg.kv_heads * cfg.head_dim
        self.embed = rand(cfg.vocab, C, scale=1.0)  # (V, C)
        self.blocks = [
            _Layer(
                ln1=norm_w(),
                wq=rand(C, C, scale=C**-0.5),
                wk=rand(C, kv_w, scale=C**-0.5),
                wv=rand(C, kv_w, scale=C**-0.5),
                wo=rand(C, C, scale=C**-0.5),
                ln2=norm_w(),
                w1=rand(C, cfg.ffn, scale=C**-0.5),
                w2=rand(cfg.ffn, C, scale=cfg.ffn**-0.5),
            )
            for _ in range(cfg.layers)
        ]
        self.ln_f = norm_w()  # (C,)
        self.lm_head = rand(C, cfg.vocab, scale=C**-0.5)  # (C, V)

    def _attend(self, q: torch.Tensor, layer: int, start: int, store: KVStore) -> torch.Tensor:
        """q: (nq, T, hs) at positions [start, start+T); each TP rank serves its q heads."""
        cfg = self.cfg
        n = q.shape[1]
        mask = torch.full((n, start + n), -math.inf, dtype=q.dtype).triu(start + 1)  # (T, S)
        out = torch.empty_like(q)  # (nq, T, hs)
        remote = getattr(store, "attend", None)  # a store's rank in another process: None here
        for rank in range(store.tp):
            qhs = sm.tp_q_heads(cfg.q_heads, cfg.kv_heads, store.tp, rank)
            qr = q[qhs.start : qhs.stop]
            y = remote(layer, start, rank, qr) if remote is not None else None
            if y is None:  # this rank's KV is here
                k, v = store.read(layer, rank)  # (h_local, S, hs) each
                y = attention_heads(qr, k, v, mask, rank_kv_of(cfg, store.tp, rank))
            out[qhs.start : qhs.stop] = y
        return out

    def forward(self, token_ids: torch.Tensor, start: int, store: KVStore) -> torch.Tensor:
        """token_ids: (T,) at positions [start, start+T) -> logits (T, V)."""
        cfg = self.cfg
        n, hs = token_ids.shape[0], cfg.head_dim
        angles = rope_angles(cfg.rope, start, n, cfg.torch_dtype)  # (T, rd/2)
        x = self.embed[token_ids]  # (T, C)
        for layer, w in enumerate(self.blocks):
            h = _rms_norm(x, w.ln1)  # (T, C)
            q = (h @ w.wq).view(n, cfg.q_heads, hs).transpose(0, 1)  # (nq, T, hs)
            k = (h @ w.wk).view(n, cfg.kv_heads, hs).transpose(0, 1)  # (nkv, T, hs)
            v = (h @ w.wv).view(n, cfg.kv_heads, hs).transpose(0, 1)  # (nkv, T, hs)
            q = apply_rope(q, angles, cfg.rope.style).contiguous()  # (nq, T, hs)
            k = apply_rope(k, angles, cfg.rope.style).contiguous()  # (nkv, T, hs)
            store.write(layer, start, k, v.contiguous())
            y = self._attend(q, layer, start, store)  # (nq, T, hs)
            x = x + y.transpose(0, 1).reshape(n, cfg.d_model) @ w.wo  # (T, C)
            h = _rms_norm(x, w.ln2)  # (T, C)
            x = x + F.silu(h @ w.w1) @ w.w2  # (T, C)
        return _rms_norm(x, self.ln_f) @ self.lm_head  # (T, V)

    def prefill(self, token_ids: torch.Tensor, kv_writer: KVStore) -> torch.Tensor:
        """Run the prompt (T,), writing its K/V into kv_writer; returns logits (T, V)."""
        return self.forward(token_ids, 0, kv_writer)

    def decode_step(self, token_id: int, position: int, kv: KVStore) -> torch.Tensor:
        """One token at `position`; reads positions < position from kv. Returns logits (V,)."""
        return self.forward(torch.tensor([token_id]), position, kv)[0]


@dataclass(frozen=True)
class Generation:
    prefill_logits: torch.Tensor  # (T, V)
    decode_logits: torch.Tensor  # (N, V), one row per decode step
    tokens: tuple[int, ...]  # greedy tokens fed to the decode steps, then the last one


def decode(
    model: TinyDecoder, first: int, position: int, steps: int, kv: KVStore
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Greedy decode `steps` tokens starting with `first` at `position`."""
    rows, tokens = [], [first]
    for i in range(steps):
        logits = model.decode_step(tokens[-1], position + i, kv)  # (V,)
        rows.append(logits)
        tokens.append(int(logits.argmax()))
    empty = torch.empty(0, model.cfg.vocab, dtype=model.cfg.torch_dtype)
    return (torch.stack(rows) if rows else empty), tuple(tokens)


def generate(
    model: TinyDecoder, prompt: torch.Tensor, steps: int, kv: KVStore | None = None
) -> Generation:
    """Prefill + `steps` greedy decode steps in one process; unpaged when kv is None."""
    store: KVStore = ContiguousKV(model.cfg) if kv is None else kv
    logits = model.prefill(prompt, store)  # (T, V)
    rows, tokens = decode(model, int(logits[-1].argmax()), prompt.shape[0], steps, store)
    return Generation(logits, rows, tokens)
