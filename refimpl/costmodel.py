"""The seed's cost formulas: KV bytes, copy lower bounds, swap vs recompute, offload benefit.

Units are in the names: ``_bytes``, ``_s`` (seconds), ``_bytes_per_s``, ``_tokens_per_s``.
All functions are pure and take plain numbers, so the scheduler, the benchmarks and the
tests share one arithmetic.

Payload (seed): ``M_KV = 2 * L * B * T * H_kv * D * s`` bytes, where 2 counts K and V.
With L=16, B=1, T=1024, H_kv=8, D=128, s=2 this is 64 MiB; at a nominal 100 Gbit/s
(12.5e9 B/s) the payload-only lower bound ``M_KV / BW`` is 5.369 ms. The bound leaves
out serialization, registration, headers, hops, queues, synchronisation, block-table
metadata, retries and the install on the target; it is not a measured latency.

Per tier (issue #22): ``swap_or_recompute_per_tier`` weighs recompute against each
``Tier`` (host, disk, ...) given its measured store and load rates and its fixed cost per
round trip, and says why in ``TierChoice.reason``; ``refimpl.demo.tiers`` measures the
rates on the real paths for ``kvown demo``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def kv_bytes(
    num_layers: int,
    batch: int,
    tokens: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    num_fields: int = 2,
) -> int:
    """M_KV: bytes of the KV cache (num_fields=2 for K and V)."""
    for name, v in (
        ("num_layers", num_layers),
        ("batch", batch),
        ("tokens", tokens),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
        ("num_fields", num_fields),
    ):
        if v < 0:
            raise ValueError(f"{name}={v} must be >= 0")
    return num_fields * num_layers * batch * tokens * kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token(
    num_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, num_fields: int = 2
) -> int:
    """Bytes one token adds to the KV cache of one sequence."""
    return kv_bytes(num_layers, 1, 1, kv_heads, head_dim, dtype_bytes, num_fields)


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Nominal link rate (decimal Gbit/s, as NICs are sold) to bytes per second."""
    return gbit_per_s * 1e9 / 8


def _positive(name: str, v: float) -> None:
    if not v > 0:
        raise ValueError(f"{name}={v} must be > 0")


def copy_lower_bound_s(payload_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """T_copy >= M_KV / BW: the payload-only time, no overheads at all."""
    _positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    return payload_bytes / bandwidth_bytes_per_s


def roundtrip_s(d2h_s: float, queue_s: float, h2d_s: float) -> float:
    """T_roundtrip >~ T_D2H + T_queue/residency + T_H2D: an offload is moved twice."""
    for name, v in (("d2h_s", d2h_s), ("queue_s", queue_s), ("h2d_s", h2d_s)):
        if v < 0:
            raise ValueError(f"{name}={v} must be >= 0")
    return d2h_s + queue_s + h2d_s


def recompute_s(tokens: int, prefill_tokens_per_s: float) -> float:
    """Time to prefill ``tokens`` again after the KV was dropped (linear throughput model).

    Real prefill cost grows faster than linearly with length (attention is quadratic), so
    this underestimates recompute for long sequences; pass a length-specific rate if known.
    """
    _positive("prefill_tokens_per_s", prefill_tokens_per_s)
    return tokens / prefill_tokens_per_s


@dataclass(frozen=True, slots=True)
class SwapDecision:
    """Swap (move KV out and back) or recompute (drop KV, prefill again)."""

    choice: str  # "swap" or "recompute"
    swap_s: float  # fixed_s + D2H + H2D for this request
    recompute_s: float  # prefill time for its tokens
    break_even_tokens: float  # swap wins above this length; inf: never, 0: always


def swap_or_recompute(
    tokens: int,
    bytes_per_token: float,
    d2h_bytes_per_s: float,
    h2d_bytes_per_s: float,
    prefill_tokens_per_s: float,
    fixed_s: float = 0.0,
) -> SwapDecision:
    """Compare the two preemption modes for one request.

    swap_s(T) = fixed_s + T * bytes_per_token * (1/BW_d2h + 1/BW_h2d)
    recompute_s(T) = T / prefill_tokens_per_s
    Both are linear in T, so swap wins above T* = fixed_s / (r - w), where r and w are
    the per-token recompute and swap times; when w >= r swap never wins (T* = inf). Ties
    go to recompute, which holds no host memory. Queue time and contention for the copy
    engines or the GPU are not modelled; the caller adds them to ``fixed_s``.
    """
    _positive("d2h_bytes_per_s", d2h_bytes_per_s)
    _positive("h2d_bytes_per_s", h2d_bytes_per_s)
    swap_per_token_s = bytes_per_token * (1 / d2h_bytes_per_s + 1 / h2d_bytes_per_s)
    recompute_per_token_s = recompute_s(1, prefill_tokens_per_s)
    swap = fixed_s + tokens * swap_per_token_s
    recompute = tokens * recompute_per_token_s
    margin = recompute_per_token_s - swap_per_token_s
    break_even = fixed_s / margin if margin > 0 else math.inf
    return SwapDecision("swap" if swap < recompute else "recompute", swap, recompute, break_even)


@dataclass(frozen=True, slots=True)
class OffloadBenefit:
    """The seed's simplified offload model; positive ``net_s`` means offload pays."""

    time_saved_s: float  # hit_rate * recompute_s_per_token * offloaded_tokens
    swap_in_s: float  # offloaded_kv_bytes / pcie_bytes_per_s
    net_s: float  # time_saved_s - swap_in_s
    worthwhile: bool  # time_saved_s > swap_in_s
    break_even_hit_rate: float  # the hit rate at which the two are equal (may exceed 1)


def offload_benefit(
    hit_rate: float,
    recompute_s_per_token: float,
    offloaded_tokens: int,
    offloaded_kv_bytes: float,
    pcie_bytes_per_s: float,
) -> OffloadBenefit:
    """Time saved by reloading instead of recomputing, against the cost of the swap-in.

    Decode wait, batch filling and DRAM occupancy are not modelled (seed: the decision is
    an online, many-variable one).
    """
    if not 0.0 <= hit_rate <= 1.0:
        raise ValueError(f"hit_rate={hit_rate} must be in [0, 1]")
    _positive("pcie_bytes_per_s", pcie_bytes_per_s)
    saved = hit_rate * recompute_s_per_token * offloaded_tokens
    swap_in = offloaded_kv_bytes / pcie_bytes_per_s
    full_hit_saving = recompute_s_per_token * offloaded_tokens
    break_even = swap_in / full_hit_saving if full_hit_saving > 0 else math.inf
    return OffloadBenefit(saved, swap_in, saved - swap_in, saved > swap_in, break_even)


@dataclass(frozen=True, slots=True)
class Tier:
    """A tier's measured rates: store (out), load (in), and a fixed cost per round trip
    (a disk tier's fsync and rename, a lookup, a staging buffer's setup)."""

    name: str
    out_bytes_per_s: float
    in_bytes_per_s: float
    fixed_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TierChoice:
    """Recompute, or the tier whose round trip is fastest, for one request's KV."""

    choice: str  # "recompute" or a Tier's name
    tokens: int  # T, per sequence
    kv_bytes: int  # M_KV
    recompute_s: float
    swap_s: dict[str, float]  # per tier: fixed_s + M_KV / out + M_KV / in
    break_even_tokens: dict[str, float]  # per tier: it beats recompute above this length
    reason: str


def swap_or_recompute_per_tier(
    tokens: int,
    tiers: Sequence[Tier],
    prefill_tokens_per_s: float,
    *,
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    batch: int = 1,
    num_fields: int = 2,
) -> TierChoice:
    """``swap_or_recompute`` for every tier from the bytes ``M_KV = 2·L·B·T·H_kv·D·s``:
    the fastest tier that beats recompute wins; with none, recompute (ties go to
    recompute, which holds nothing, then to the earlier tier)."""
    per_token = kv_bytes_per_token(num_layers, kv_heads, head_dim, dtype_bytes, num_fields)
    m = kv_bytes(num_layers, batch, tokens, kv_heads, head_dim, dtype_bytes, num_fields)
    swap: dict[str, float] = {}
    even: dict[str, float] = {}
    recompute = recompute_s(batch * tokens, prefill_tokens_per_s)
    for t in tiers:
        d = swap_or_recompute(
            batch * tokens,
            per_token,
            t.out_bytes_per_s,
            t.in_bytes_per_s,
            prefill_tokens_per_s,
            t.fixed_s,
        )
        swap[t.name], even[t.name] = d.swap_s, d.break_even_tokens / batch
    best = min(swap, key=lambda n: swap[n], default=None)
    choice = best if best is not None and swap[best] < recompute else "recompute"
    terms = f"{num_fields}·{num_layers}·{batch}·{tokens}·{kv_heads}·{head_dim}·{dtype_bytes}"
    parts = [f"M_KV = {terms} = {m} B", f"recompute {recompute * 1e3:.3g} ms"]
    parts += [f"{n} {s * 1e3:.3g} ms (wins above {even[n]:.3g} tokens)" for n, s in swap.items()]
    return TierChoice(choice, tokens, m, recompute, swap, even, "; ".join(parts))
