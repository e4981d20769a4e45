"""``KVGeometry``: the one description of a side's paged KV, and its converters.

One value says everything a pool's bytes mean: layers, KV heads, head dim, block size,
dtype, axis order and the mesh (TP shards heads, CP shards tokens). ``kv_heads`` is always
the model's global count; ``kv_heads_per_rank`` is what one TP rank's pool holds (the
shard map of ``spec.shardmap``, replicated when ``kv_heads < tp``).

The older per-module shapes are views of it, each with a converter named for its
direction: ``rank_pool_geometry()`` (``PoolGeometry`` of one rank's pool),
``kv_layout()`` (``KVLayout``, the reshard declaration), ``block_dims()`` (``BlockDims``),
``to_local_config(model)`` / ``from_local_config(local)`` (the receiver's ``LocalConfig``)
and ``from_manifest_source(m)`` (the sender's geometry as a manifest states it).

``ModelIdentity`` is the rest of what the manifest gate compares: model, adapter,
quantization, a quantized cache's scales and RoPE (the spec's one ``RopeConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from refimpl.pool import TORCH_DTYPES, PoolGeometry
from refimpl.rankpools import RankPools
from refimpl.reshard import KVLayout
from spec import shardmap as sm
from spec.manifest import DTYPE_BYTES, LocalConfig, Manifest, RopeConfig

_HF_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """What must match for KV to mean the same thing on both sides (besides geometry)."""

    model_id: str  # weights identity
    rope: RopeConfig  # keys are stored rotated: style, base and scaling must agree
    adapter_id: str | None = None  # LoRA / adapter, None for the base model
    quantization: str = "none"  # a key of spec.manifest.QUANTIZATION_DTYPES
    # A quantized cache's dequantization scales, layer-major: one per (layer, cache field)
    # (vLLM's per-tensor ``_k_scale``/``_v_scale`` of each attention layer), or one per
    # (layer, field, kv head) of the model's heads (per-head). None: the cache has none.
    # They travel in the manifest; the receiver refuses a handoff whose scales differ.
    kv_scales: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """One side's paged KV; validated on construction (ValueError names every problem)."""

    num_layers: int
    kv_heads: int  # global KV heads of the model (before TP)
    head_dim: int
    block_size: int  # tokens per block
    dtype: str  # storage dtype, a key of spec.manifest.DTYPE_BYTES ("bfloat16", ...)
    layout: str = "heads_major"  # axis order of one block, one of spec.shardmap.LAYOUTS
    tp: int = 1  # tensor-parallel ranks (shard heads)
    cp: int = 1  # context-parallel ranks (shard tokens)
    cache_fields: tuple[str, ...] = ("k", "v")  # per-layer cache tensors

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)!r} must be an int >= 1"
            for name in ("num_layers", "kv_heads", "head_dim", "block_size", "tp", "cp")
            if type(getattr(self, name)) is not int or getattr(self, name) < 1
        ]
        if self.dtype not in DTYPE_BYTES:
            problems.append(f"dtype={self.dtype!r}; known: {sorted(DTYPE_BYTES)}")
        if self.layout not in sm.LAYOUTS:
            problems.append(f"layout={self.layout!r}; known: {list(sm.LAYOUTS)}")
        if not self.cache_fields or len(set(self.cache_fields)) != len(self.cache_fields):
            problems.append(f"cache_fields={self.cache_fields!r} must be distinct and non-empty")
        if not problems:
            try:
                sm.tp_check(self.kv_heads, self.tp)
            except ValueError as e:
                problems.append(str(e))
        if problems:
            raise ValueError("KVGeometry: " + "; ".join(problems))

    # ------------------------------------------------------------ derived sizes
    @property
    def kv_heads_per_rank(self) -> int:
        return sm.tp_local_heads(self.kv_heads, self.tp)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @property
    def num_fields(self) -> int:
        return len(self.cache_fields)

    @property
    def canonical_block_bytes(self) -> int:
        """Bytes of one whole block (every head, heads_major): what a checksum covers."""
        n = self.num_layers * self.num_fields * self.kv_heads * self.block_size * self.head_dim
        return n * DTYPE_BYTES[self.dtype]

    def blocks_for(self, num_tokens: int) -> int:
        return sm.blocks_needed(num_tokens, self.block_size)

    def with_(self, **changes: Any) -> KVGeometry:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    # ------------------------------------------------------------ converters
    def rank_pool_geometry(self) -> PoolGeometry:
        """The block shape of one TP rank's pool (its local heads)."""
        return PoolGeometry(
            self.num_layers,
            self.num_fields,
            self.kv_heads_per_rank,
            self.block_size,
            self.head_dim,
            self.torch_dtype,
            self.layout,
        )

    def kv_layout(self) -> KVLayout:
        """The reshard declaration (global heads, mesh)."""
        return KVLayout(
            self.layout,
            self.num_layers,
            self.kv_heads,
            self.block_size,
            self.head_dim,
            self.tp,
            self.cp,
        )

    def block_dims(self) -> sm.BlockDims:
        """One rank's block dims for spec.shardmap."""
        return sm.BlockDims(self.num_layers, self.kv_heads_per_rank, self.block_size, self.head_dim)

    def to_local_config(self, model: ModelIdentity) -> LocalConfig:
        """The receiver's LocalConfig, for spec.manifest.check_compatible."""
        return LocalConfig(
            model_id=model.model_id,
            adapter_id=model.adapter_id,
            dtype=self.dtype,
            quantization=model.quantization,
            num_layers=self.num_layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            block_size=self.block_size,
            layout=self.layout,
            rope=model.rope,
            tp=self.tp,
            cp=self.cp,
            cache_fields=self.cache_fields,
            kv_scales=model.kv_scales,
        )

    @classmethod
    def from_local_config(cls, local: LocalConfig) -> KVGeometry:
        return cls(
            local.num_layers,
            local.kv_heads,
            local.head_dim,
            local.block_size,
            local.dtype,
            local.layout,
            local.tp,
            local.cp,
            local.cache_fields,
        )

    @classmethod
    def from_manifest_source(cls, m: Manifest) -> KVGeometry:
        """The sender's geometry as the manifest states it (src_tp, src_cp)."""
        return cls(
            m.num_layers,
            m.kv_heads,
            m.head_dim,
            m.block_size,
            m.dtype,
            m.layout,
            m.src_tp,
            m.src_cp,
            m.cache_fields,
        )

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        tp: int = 1,
        block_size: int = 16,
        dtype: str | torch.dtype | None = None,
        layout: str = "heads_major",
    ) -> KVGeometry:
        """From a transformers ``PretrainedConfig`` (read by attribute; no import needed).

        ``dtype`` defaults to the config's ``torch_dtype``/``dtype``, else float32.
        """
        layers = getattr(config, "num_hidden_layers", None)
        q_heads = getattr(config, "num_attention_heads", None)
        if not isinstance(layers, int) or not isinstance(q_heads, int):
            raise ValueError(
                f"{type(config).__name__} has no int num_hidden_layers/num_attention_heads"
            )
        kv_heads = getattr(config, "num_key_value_heads", None) or q_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // q_heads
        if dtype is None:  # read the attributes set, not the deprecated alias property
            dtype = vars(config).get("dtype") or vars(config).get("torch_dtype")
        if isinstance(dtype, torch.dtype):
            if dtype not in _HF_DTYPES:
                raise ValueError(f"dtype {dtype} has no manifest name; known {sorted(DTYPE_BYTES)}")
            dtype = _HF_DTYPES[dtype]
        return cls(layers, kv_heads, head_dim, block_size, dtype or "float32", layout, tp)

    def make_pools(
        self, capacity: int, *, device: str | None = "cpu", host: bool = False
    ) -> RankPools:
        """Pools for this geometry: one per TP rank, sharing one block table."""
        if self.cp != 1:
            raise ValueError(f"make_pools: cp={self.cp}; one worker's pools hold cp=1")
        return RankPools(
            self.tp,
            self.kv_heads,
            self.rank_pool_geometry(),
            capacity,
            host=host,
            device=device,
        )

    def make_rank_pools(
        self, rank: int, capacity: int, *, device: str | None = "cpu", host: bool = False
    ) -> RankPools:
        """The pools of TP rank ``rank`` alone (its process): its heads, one block table."""
        return self.rank_view(rank).make_pools(capacity, device=device, host=host)

    def rank_view(self, rank: int) -> KVGeometry:
        """What one TP rank's process holds: a tp=1 geometry of its local heads."""
        if type(rank) is not int or not 0 <= rank < self.tp:
            raise ValueError(f"rank={rank!r}; this geometry has TP ranks 0..{self.tp - 1}")
        return self.with_(kv_heads=self.kv_heads_per_rank, tp=1)

    def check_rank_pools(self, pools: RankPools, rank: int) -> None:
        """Raise ValueError unless ``pools`` are TP rank ``rank``'s alone."""
        self.rank_view(rank).check_pools(pools, f"rank {rank} pools")

    def check_pools(self, pools: RankPools, where: str = "pools") -> None:
        """Raise ValueError unless ``pools`` hold exactly this geometry."""
        want = self.rank_pool_geometry()
        problems = []
        if pools.tp != self.tp:
            problems.append(f"{len(pools.pools)} TP ranks, geometry tp={self.tp}")
        if pools.kv_heads != self.kv_heads:
            problems.append(f"kv_heads={pools.kv_heads}, geometry {self.kv_heads}")
        for r, p in enumerate(pools.pools):
            if p.geometry != want:
                problems.append(f"rank {r} pool is {p.geometry}, geometry wants {want}")
        if problems:
            raise ValueError(f"{where} do not match {self}: " + "; ".join(problems))
