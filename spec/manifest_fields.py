"""Field checks of the handoff manifest: caps on untrusted sizes, and one reason per
problem (pure Python). ``spec/manifest.py`` builds the records on top of these."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from spec.shardmap import LAYOUTS, tp_check
from spec.strict_json import short

MANIFEST_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = frozenset({MANIFEST_VERSION})

# Storage element type of the cache -> bytes per element.
DTYPE_BYTES: Final[Mapping[str, int]] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
# Quantization scheme -> the storage dtypes it may use.
QUANTIZATION_DTYPES: Final[Mapping[str, frozenset[str]]] = {
    "none": frozenset({"float16", "bfloat16", "float32"}),
    "fp8_e4m3": frozenset({"float8_e4m3fn"}),
    "fp8_e5m2": frozenset({"float8_e5m2"}),
    "int8": frozenset({"int8"}),
}
# LAYOUTS (axis order of one block) and the TP sharding rule come from spec/shardmap.py:
# heads_major [layers, fields, kv_heads, block_size, head_dim], tokens_major swaps the
# kv_heads and block_size axes.
ROPE_SCALINGS: Final = frozenset({"none", "linear", "dynamic", "yarn", "llama3", "longrope"})
# Which dims rotate together: neox rotates halves (x[i], x[i + rd/2]), as Llama does
# ("rotate_half"); gptj rotates interleaved pairs (x[2i], x[2i + 1]).
ROPE_STYLES: Final = frozenset({"neox", "gptj"})
# Scaling parameters beyond the factor, and the schemes that read them.
ROPE_PARAM_SCALINGS: Final[Mapping[str, frozenset[str]]] = {
    "low_freq_factor": frozenset({"llama3"}),
    "high_freq_factor": frozenset({"llama3"}),
    "original_max_position": frozenset({"llama3", "yarn", "dynamic", "longrope"}),
}

# Caps on untrusted sizes: a receiver reserves memory from these numbers.
MAX_ID_CHARS: Final = 256
MAX_TOKENS: Final = 1 << 22
MAX_TOKEN_ID: Final = (1 << 31) - 1
MAX_POSITION: Final = 1 << 24
MAX_LAYERS: Final = 1024
MAX_KV_HEADS: Final = 1024
MAX_HEAD_DIM: Final = 2048
MAX_BLOCK_SIZE: Final = 4096
MAX_PARALLEL: Final = 1024
MAX_CACHE_FIELDS: Final = 8
MAX_EPOCH: Final = (1 << 63) - 1
MAX_ROPE_THETA: Final = 1e12
MAX_ROPE_FACTOR: Final = 1e6
MAX_PAYLOAD_BYTES: Final = 1 << 40
MAX_JSON_CHARS: Final = 1 << 26
MAX_JSON_DEPTH: Final = 2  # the manifest object, then rope or an array: nothing deeper
MAX_INT_DIGITS: Final = 19  # MAX_EPOCH has 19 digits; no field needs more
# A quantized cache's dequantization scales (``kv_scales``): finite, at least float32's
# smallest normal (an engine keeps them as float32: a subnormal or 0 would divide to inf),
# at most MAX_KV_SCALE.
MIN_KV_SCALE: Final = 2.0**-126
MAX_KV_SCALE: Final = 1e6

_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_XXH3_HEX = re.compile(r"[0-9a-f]{16}")


class ManifestError(ValueError):
    """A malformed or hostile manifest; ``reasons`` names every problem, one per entry."""

    prop: str = "ManifestGate"

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("; ".join(self.reasons) or "invalid manifest")


# ---------------------------------------------------------------- field checkers
def _int_reason(v: object, lo: int, hi: int) -> str | None:
    if type(v) is not int:  # bool is an int subclass; refuse it too
        return f"expected int, got {type(v).__name__}"
    if not lo <= v <= hi:
        return f"{short(v)} outside [{lo}, {hi}]"
    return None


def _id_reason(v: object) -> str | None:
    if not isinstance(v, str):
        return f"expected string, got {type(v).__name__}"
    if not 1 <= len(v) <= MAX_ID_CHARS or not v.isprintable():
        return f"expected 1..{MAX_ID_CHARS} printable characters"
    return None


def _choice_reason(
    v: object, allowed: Mapping[str, object] | frozenset[str] | tuple[str, ...], what: str
) -> str | None:
    if not isinstance(v, str):
        return f"expected string, got {type(v).__name__}"
    if v not in allowed:
        return f"unknown {what} {short(v)}; known: {sorted(allowed)}"
    return None


def _token_ids_reason(v: object) -> str | None:
    if not isinstance(v, tuple):
        return f"expected array, got {type(v).__name__}"
    if len(v) > MAX_TOKENS:
        return f"{len(v)} entries exceed the cap {MAX_TOKENS}"
    if set(map(type, v)) <= {int} and (not v or 0 <= min(v) and max(v) <= MAX_TOKEN_ID):
        return None  # the common case, checked at C speed
    i, t = next((i, t) for i, t in enumerate(v) if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID)
    return f"entry {i} ({short(t)}) is not an int in [0, {MAX_TOKEN_ID}]"


def _cache_fields_reason(v: object) -> str | None:
    if not isinstance(v, tuple):
        return f"expected array, got {type(v).__name__}"
    if not 1 <= len(v) <= MAX_CACHE_FIELDS:
        return f"expected 1..{MAX_CACHE_FIELDS} names, got {len(v)}"
    if not all(isinstance(f, str) and _FIELD_NAME.fullmatch(f) for f in v):
        return f"names must match {_FIELD_NAME.pattern}: {short(v)}"
    if len(set(v)) != len(v):
        return f"duplicate names in {short(v)}"
    return None


def _checksums_reason(v: object) -> str | None:
    if not isinstance(v, tuple):
        return f"expected array, got {type(v).__name__}"
    if len(v) > MAX_TOKENS:
        return f"{len(v)} entries exceed the cap {MAX_TOKENS}"
    for i, c in enumerate(v):
        if not isinstance(c, str) or not _XXH3_HEX.fullmatch(c):
            return f"entry {i} ({short(c)}) is not 16 lowercase hex digits (xxh3-64)"
    return None


def _rope_reason(v: object) -> str | None:
    return None if isinstance(v, RopeConfig) else f"expected object, got {type(v).__name__}"


def _kv_scales_reason(v: object) -> str | None:
    """The field alone: an array of scales, each a number in [MIN_KV_SCALE, MAX_KV_SCALE]
    (its length against the geometry is ``kv_scales_shape_reason``)."""
    if v is None:
        return None  # absent or null: the cache states no scales
    if not isinstance(v, tuple):
        return f"expected array or null, got {type(v).__name__}"
    cap = MAX_LAYERS * MAX_CACHE_FIELDS * MAX_KV_HEADS
    if not 1 <= len(v) <= cap:
        return f"expected 1..{cap} scales, got {len(v)}"
    for i, x in enumerate(v):
        if type(x) not in (int, float):  # bool is refused too
            return f"entry {i} ({short(x)}) is not a number"
        n = cast(int | float, x)
        if isinstance(n, float) and not math.isfinite(n):
            return f"entry {i} ({short(n)}) is not finite"
        if not MIN_KV_SCALE <= n <= MAX_KV_SCALE:  # int vs float compares exactly
            return f"entry {i} ({short(n)}) outside [2**-126, {MAX_KV_SCALE}]"
    return None


def kv_scales_granularity(n: int, num_layers: int, num_fields: int, kv_heads: int) -> str | None:
    """What ``n`` scales mean: one per (layer, field) (vLLM's ``_k_scale``/``_v_scale``),
    one per (layer, field, kv head), or None (per-block scales cannot be stated)."""
    if n == num_layers * num_fields:
        return "per_tensor"
    if n == num_layers * num_fields * kv_heads:
        return "per_head"
    return None


Check = Callable[[object], str | None]


def _count(lo: int, hi: int) -> Check:
    return lambda v: _int_reason(v, lo, hi)


_MANIFEST_CHECKS: Final[Mapping[str, Check]] = {
    "request_id": _id_reason,
    "model_id": _id_reason,
    "adapter_id": lambda v: None if v is None else _id_reason(v),
    "token_ids": _token_ids_reason,
    "num_tokens": _count(1, MAX_TOKENS),
    "cache_fields": _cache_fields_reason,
    "num_layers": _count(1, MAX_LAYERS),
    "dtype": lambda v: _choice_reason(v, DTYPE_BYTES, "dtype"),
    "quantization": lambda v: _choice_reason(v, QUANTIZATION_DTYPES, "quantization"),
    "kv_heads": _count(1, MAX_KV_HEADS),
    "head_dim": _count(1, MAX_HEAD_DIM),
    "block_size": _count(1, MAX_BLOCK_SIZE),
    "layout": lambda v: _choice_reason(v, LAYOUTS, "layout"),
    "start_pos": _count(0, MAX_POSITION),
    "rope": _rope_reason,
    "src_tp": _count(1, MAX_PARALLEL),
    "src_cp": _count(1, MAX_PARALLEL),
    "dst_tp": _count(1, MAX_PARALLEL),
    "dst_cp": _count(1, MAX_PARALLEL),
    "prefix_blocks": _count(0, MAX_TOKENS),
    "block_checksums": _checksums_reason,
    "version": lambda v: (
        None
        if type(v) is int and v in SUPPORTED_VERSIONS
        else f"unknown version {short(v)}; supported: {sorted(SUPPORTED_VERSIONS)}"
    ),
    "epoch": _count(0, MAX_EPOCH),
    "kv_scales": _kv_scales_reason,  # optional: absent (None) in today's manifests
}


def _shard_reason(tp: int, kv_heads: int) -> str | None:
    try:
        tp_check(kv_heads, tp)
    except ValueError as e:
        return str(e)
    return None


def _geometry_reasons(v: Mapping[str, object]) -> list[str]:
    """Rules across fields shared by Manifest and LocalConfig; only fields given are read."""
    r: list[str] = []
    dtype, quant = v.get("dtype"), v.get("quantization")
    if isinstance(dtype, str) and isinstance(quant, str) and quant in QUANTIZATION_DTYPES:
        if dtype not in QUANTIZATION_DTYPES[quant]:
            r.append(f"dtype: {dtype!r} cannot hold quantization {quant!r}")
    scales = v.get("kv_scales")
    if isinstance(scales, tuple) and isinstance(quant, str):
        if quant == "none":
            r.append("kv_scales: given for quantization 'none'; only a quantized cache has scales")
        shape = ("num_layers", "cache_fields", "kv_heads")
        if all(k in v for k in shape):
            layers, names, heads = (cast(Any, v[k]) for k in shape)
            if kv_scales_granularity(len(scales), layers, len(names), heads) is None:
                r.append(
                    f"kv_scales: {len(scales)} entries; per tensor needs num_layers x "
                    f"cache_fields = {layers * len(names)}, per head x kv_heads = "
                    f"{layers * len(names) * heads} (per-block scales are not supported)"
                )
    rope, head_dim = v.get("rope"), v.get("head_dim")
    if isinstance(rope, RopeConfig) and type(head_dim) is int and rope.rotary_dim > head_dim:
        r.append(f"rope.rotary_dim: {rope.rotary_dim} exceeds head_dim={head_dim}")
    return r


def _manifest_reasons(values: Mapping[str, object]) -> list[str]:
    """Every problem with the fields present in ``values`` (missing ones are not reported)."""
    r: list[str] = []
    ok: dict[str, Any] = {}
    for name, check in _MANIFEST_CHECKS.items():
        if name in values:
            reason = check(values[name])
            if reason is None:
                ok[name] = values[name]
            else:
                r.append(f"{name}: {reason}")
    r += _geometry_reasons(ok)
    if {"token_ids", "num_tokens"} <= ok.keys() and len(ok["token_ids"]) != ok["num_tokens"]:
        r.append(f"token_ids: {len(ok['token_ids'])} entries but num_tokens={ok['num_tokens']}")
    if {"start_pos", "num_tokens"} <= ok.keys() and (
        ok["start_pos"] + ok["num_tokens"] > MAX_POSITION
    ):
        r.append(f"start_pos: positions end past the cap {MAX_POSITION}")
    for side in ("src_tp", "dst_tp"):
        if {side, "kv_heads"} <= ok.keys():
            reason = _shard_reason(ok[side], ok["kv_heads"])
            if reason:
                r.append(f"{side}: {reason}")
    if {"num_tokens", "block_size", "prefix_blocks"} <= ok.keys():
        n, bs, pre = ok["num_tokens"], ok["block_size"], ok["prefix_blocks"]
        if pre > n // bs:
            r.append(
                f"prefix_blocks: {pre} exceeds the {n // bs} full blocks of "
                f"num_tokens={n} at block_size={bs}"
            )
        elif "block_checksums" in ok and len(ok["block_checksums"]) != -(-n // bs) - pre:
            r.append(
                f"block_checksums: {len(ok['block_checksums'])} entries for "
                f"{-(-n // bs) - pre} sent blocks (num_tokens={n}, block_size={bs}, "
                f"prefix_blocks={pre})"
            )
    geometry = ("num_tokens", "num_layers", "cache_fields", "kv_heads", "head_dim", "dtype")
    if set(geometry) <= ok.keys():
        fields_per_layer = len(ok["cache_fields"])
        size = ok["num_tokens"] * ok["num_layers"] * fields_per_layer * ok["kv_heads"]
        size *= ok["head_dim"] * DTYPE_BYTES[ok["dtype"]]
        if size > MAX_PAYLOAD_BYTES:
            r.append(f"num_tokens: payload of {size} bytes exceeds the cap {MAX_PAYLOAD_BYTES}")
    return r


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding applied to the stored keys (the one RoPE type of the project).

    Every field must match between sender and receiver: keys are stored rotated, so
    another base, style or scaling is silently wrong at every position.
    """

    theta: float  # base frequency, e.g. 10000.0
    rotary_dim: int  # leading dims of each head that are rotated
    scaling: str = "none"  # scaling scheme, one of ROPE_SCALINGS
    scaling_factor: float = 1.0  # context extension factor for the scheme
    style: str = "neox"  # which dims pair up, one of ROPE_STYLES
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    original_max_position: int | None = None  # llama3, yarn, dynamic, longrope

    def __post_init__(self) -> None:
        r = rope_reasons(self.to_json_dict())
        if r:
            raise ManifestError(r)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "theta": self.theta,
            "rotary_dim": self.rotary_dim,
            "scaling": self.scaling,
            "scaling_factor": self.scaling_factor,
            "style": self.style,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position": self.original_max_position,
        }


def _float_reason(v: object, lo: float, hi: float) -> str | None:
    """Range-checked before any float conversion: ``float()`` of a 309-digit int raises."""
    if type(v) not in (int, float):  # bool is refused too
        return f"expected number, got {type(v).__name__}"
    n = cast(int | float, v)
    if isinstance(n, float) and not math.isfinite(n):
        return f"{short(n)} is not finite"
    if not lo < n <= hi:  # int vs float compares exactly, without converting
        return f"{short(n)} outside ({lo}, {hi}]"
    return None


# Optional JSON fields of a rope object (absent or null: the default), so that a manifest
# written before they existed still parses.
ROPE_OPTIONAL: Final = ("style", "low_freq_factor", "high_freq_factor", "original_max_position")


def rope_reasons(d: object) -> list[str]:
    """Every problem with a JSON rope object, each prefixed ``rope.<field>``."""
    if not isinstance(d, dict):
        return [f"rope: expected object, got {type(d).__name__}"]
    optional: dict[str, Check] = {
        "style": lambda v: _choice_reason(v, ROPE_STYLES, "style"),
        "low_freq_factor": lambda v: _float_reason(v, 0.0, MAX_ROPE_FACTOR),
        "high_freq_factor": lambda v: _float_reason(v, 0.0, MAX_ROPE_FACTOR),
        "original_max_position": lambda v: _int_reason(v, 1, MAX_POSITION),
    }
    checks: dict[str, Check] = {
        "theta": lambda v: _float_reason(v, 0.0, MAX_ROPE_THETA),
        "rotary_dim": lambda v: (
            _int_reason(v, 2, MAX_HEAD_DIM)
            or (None if cast(int, v) % 2 == 0 else f"{v} is odd; rotation pairs dims")
        ),
        "scaling": lambda v: _choice_reason(v, ROPE_SCALINGS, "scaling"),
        "scaling_factor": lambda v: _float_reason(v, 0.0, MAX_ROPE_FACTOR),
    }
    r = [f"rope.{short(k)}: unknown field" for k in d if k not in checks and k not in optional]
    for name, check in checks.items():
        if name not in d:
            r.append(f"rope.{name}: missing")
        elif (reason := check(d[name])) is not None:
            r.append(f"rope.{name}: {reason}")
    for name, check in optional.items():
        if d.get(name) is not None and (reason := check(d[name])) is not None:
            r.append(f"rope.{name}: {reason}")
    return r or _rope_scaling_reasons(d)


def _rope_scaling_reasons(d: Mapping[str, Any]) -> list[str]:
    """Parameters that the scheme would ignore, or that it needs and lacks."""
    scaling, r = d["scaling"], []
    if scaling == "none" and d["scaling_factor"] != 1.0:
        r.append(f"rope.scaling_factor: {d['scaling_factor']!r} with scaling 'none' is ignored")
    for name, users in ROPE_PARAM_SCALINGS.items():
        given = d.get(name) is not None
        if given and scaling not in users:
            r.append(f"rope.{name}: not read by scaling {scaling!r} (only {sorted(users)})")
        if not given and scaling == "llama3":
            r.append(f"rope.{name}: missing; scaling 'llama3' needs it")
    low, high = d.get("low_freq_factor"), d.get("high_freq_factor")
    if low is not None and high is not None and not low < high:
        r.append(f"rope.low_freq_factor: {low!r} must be below high_freq_factor {high!r}")
    return r
