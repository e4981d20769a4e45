"""The handoff manifest and the receiver's compatibility rule (pure Python).

A prefill worker hands a request's KV to a decode worker as bytes plus this manifest. Bare
tensors cannot tell the receiver whether they fit its model and page table; the manifest
names every fact the receiver must check before it installs anything (``ManifestGate``).

``from_json_dict`` treats its input as hostile: it checks every field and raises one
:class:`ManifestError` whose ``reasons`` list every problem, not just the first. Nothing
crosses as pickle; ``to_json_dict`` gives plain JSON types.

Compatibility rule (``check_compatible``), manifest field vs the receiver's ``LocalConfig``:

=====================  =============  ==========================================
field                  rule           why
=====================  =============  ==========================================
model_id, adapter_id   must match     other weights give other keys/values
dtype, quantization    must match     bytes would be read as another number type
num_layers, kv_heads,  must match     the block shape differs; no mapping exists
head_dim, cache_fields
rope                   must match     keys are stored rotated; another RoPE (base,
                                      style neox/gptj, scaling and its parameters)
                                      is silently wrong at every position
kv_scales (optional)   must match     a quantized cache's bytes mean nothing without
                                      its dequantization scales; the first differing
                                      (layer, field[, head]) is named; stated by one
                                      side only is refused too
dst_tp, dst_cp         must equal     the sender sharded for another target mesh
                       local tp, cp
block_size             convertible    re-page tokens into the local block size
layout                 convertible    permute axes (heads_major <-> tokens_major)
src_tp -> dst_tp       convertible    reshard kv heads across ranks
src_cp -> dst_cp       convertible    reshard the context (token) ranges
=====================  =============  ==========================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Final, cast

# the public names of spec.manifest_fields are re-exported from here
from spec.manifest_fields import DTYPE_BYTES as DTYPE_BYTES
from spec.manifest_fields import MANIFEST_VERSION as MANIFEST_VERSION
from spec.manifest_fields import MAX_BLOCK_SIZE as MAX_BLOCK_SIZE
from spec.manifest_fields import MAX_CACHE_FIELDS as MAX_CACHE_FIELDS
from spec.manifest_fields import MAX_EPOCH as MAX_EPOCH
from spec.manifest_fields import MAX_HEAD_DIM as MAX_HEAD_DIM
from spec.manifest_fields import MAX_ID_CHARS as MAX_ID_CHARS
from spec.manifest_fields import MAX_INT_DIGITS as MAX_INT_DIGITS
from spec.manifest_fields import MAX_JSON_CHARS as MAX_JSON_CHARS
from spec.manifest_fields import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from spec.manifest_fields import MAX_KV_HEADS as MAX_KV_HEADS
from spec.manifest_fields import MAX_KV_SCALE as MAX_KV_SCALE
from spec.manifest_fields import MAX_LAYERS as MAX_LAYERS
from spec.manifest_fields import MAX_PARALLEL as MAX_PARALLEL
from spec.manifest_fields import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from spec.manifest_fields import MAX_POSITION as MAX_POSITION
from spec.manifest_fields import MAX_ROPE_FACTOR as MAX_ROPE_FACTOR
from spec.manifest_fields import MAX_ROPE_THETA as MAX_ROPE_THETA
from spec.manifest_fields import MAX_TOKEN_ID as MAX_TOKEN_ID
from spec.manifest_fields import MAX_TOKENS as MAX_TOKENS
from spec.manifest_fields import MIN_KV_SCALE as MIN_KV_SCALE
from spec.manifest_fields import QUANTIZATION_DTYPES as QUANTIZATION_DTYPES
from spec.manifest_fields import ROPE_SCALINGS as ROPE_SCALINGS
from spec.manifest_fields import ROPE_STYLES as ROPE_STYLES
from spec.manifest_fields import SUPPORTED_VERSIONS as SUPPORTED_VERSIONS
from spec.manifest_fields import ManifestError as ManifestError
from spec.manifest_fields import RopeConfig as RopeConfig
from spec.manifest_fields import _manifest_reasons, kv_scales_granularity
from spec.manifest_fields import rope_reasons as rope_reasons
from spec.strict_json import StrictJSONError, loads_strict, short


# ---------------------------------------------------------------- records
def _rope_from_json(d: object) -> RopeConfig | list[str]:
    r = rope_reasons(d)
    if r:
        return r
    m = cast(dict[str, Any], d)
    low, high = m.get("low_freq_factor"), m.get("high_freq_factor")
    return RopeConfig(
        float(m["theta"]),
        m["rotary_dim"],
        m["scaling"],
        float(m["scaling_factor"]),
        m.get("style") or "neox",
        None if low is None else float(low),
        None if high is None else float(high),
        m.get("original_max_position"),
    )


@dataclass(frozen=True, slots=True)
class Manifest:
    """What the sender asserts about a handed-off KV; validated on construction."""

    request_id: str  # the request whose KV this is
    model_id: str  # weights identity
    adapter_id: str | None  # LoRA / adapter identity, None for the base model
    token_ids: tuple[int, ...]  # the tokens the KV encodes
    num_tokens: int  # == len(token_ids)
    cache_fields: tuple[str, ...]  # per-layer tensors, e.g. ("k", "v")
    num_layers: int
    dtype: str  # storage element type, a key of DTYPE_BYTES
    quantization: str  # a key of QUANTIZATION_DTYPES
    kv_heads: int  # total KV heads of the model (before TP sharding)
    head_dim: int
    block_size: int  # tokens per block
    layout: str  # axis order of one block, one of LAYOUTS
    start_pos: int  # logical position of token_ids[0]
    rope: RopeConfig
    src_tp: int  # sender's tensor-parallel degree
    src_cp: int  # sender's context-parallel degree
    dst_tp: int  # the receiver mesh the sender sharded for
    dst_cp: int
    prefix_blocks: int  # leading blocks the receiver already holds; not sent
    block_checksums: tuple[str, ...]  # xxh3-64 hex, one per sent block, in block order
    version: int  # protocol version, in SUPPORTED_VERSIONS
    epoch: int  # handoff attempt; fences messages of older attempts
    # Optional (absent from today's manifests): a quantized cache's dequantization scales,
    # layer-major: per (layer, field), or per (layer, field, kv head) of the model's heads.
    kv_scales: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        r = _manifest_reasons({f.name: getattr(self, f.name) for f in fields(self)})
        if r:
            raise ManifestError(r)

    @property
    def num_blocks(self) -> int:
        """Blocks covering all tokens (the last one may be partial)."""
        return -(-self.num_tokens // self.block_size)

    @property
    def sent_blocks(self) -> range:
        """Logical indices of the blocks carried by chunks: the suffix after the prefix."""
        return range(self.prefix_blocks, self.num_blocks)

    @property
    def positions(self) -> range:
        return range(self.start_pos, self.start_pos + self.num_tokens)

    @property
    def block_bytes(self) -> int:
        """Bytes of one (padded) block across all layers and cache fields."""
        return (
            self.num_layers
            * len(self.cache_fields)
            * self.kv_heads
            * self.block_size
            * self.head_dim
            * DTYPE_BYTES[self.dtype]
        )

    @property
    def payload_bytes(self) -> int:
        """Bytes the receiver must hold for the whole request (every block, padded)."""
        return self.block_bytes * self.num_blocks

    @property
    def sent_bytes(self) -> int:
        return self.block_bytes * len(self.sent_blocks)

    def to_json_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["token_ids"] = list(self.token_ids)
        d["cache_fields"] = list(self.cache_fields)
        d["block_checksums"] = list(self.block_checksums)
        d["rope"] = self.rope.to_json_dict()
        if self.kv_scales is None:
            del d["kv_scales"]  # absent: today's format, byte for byte
        else:
            d["kv_scales"] = list(self.kv_scales)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), separators=(",", ":"))

    @classmethod
    def from_json_dict(cls, d: object) -> Manifest:
        return from_json_dict(d)


# Optional fields: absent (or null) means the default, so every manifest written before
# they existed stays valid; ``to_json_dict`` leaves them out when they hold the default.
MANIFEST_OPTIONAL_FIELDS: Final = ("kv_scales",)
# The fields every manifest must state.
MANIFEST_FIELDS: Final = tuple(
    f.name for f in fields(Manifest) if f.name not in MANIFEST_OPTIONAL_FIELDS
)


def from_json_dict(d: object) -> Manifest:
    """Validate an untrusted JSON object; raise ManifestError listing every problem."""
    if not isinstance(d, dict):
        raise ManifestError([f"manifest: expected object, got {type(d).__name__}"])
    known = (*MANIFEST_FIELDS, *MANIFEST_OPTIONAL_FIELDS)
    reasons = [f"{short(k)}: unknown field" for k in d if k not in known]
    values: dict[str, object] = {}
    for name in MANIFEST_OPTIONAL_FIELDS:
        if d.get(name) is not None:
            v = d[name]
            values[name] = tuple(v) if isinstance(v, list) else v
    for name in MANIFEST_FIELDS:
        if name not in d:
            reasons.append(f"{name}: missing")
            continue
        v = d[name]
        if name == "rope":
            rope = _rope_from_json(v)
            if isinstance(rope, list):
                reasons += rope
                continue
            v = rope
        elif isinstance(v, list):
            v = tuple(v)
        values[name] = v
    reasons += _manifest_reasons(values)
    if reasons:
        raise ManifestError(reasons)
    return Manifest(**cast(dict[str, Any], values))


def from_json(text: str | bytes) -> Manifest:
    """Parse and validate a JSON document: size capped, then strict JSON (duplicate keys,
    NaN/Infinity, nesting past ``MAX_JSON_DEPTH`` and integers past ``MAX_INT_DIGITS``
    digits refused), then every field checked."""
    if not isinstance(text, str | bytes | bytearray):
        raise ManifestError([f"manifest: expected str or bytes, got {type(text).__name__}"])
    try:
        d = loads_strict(
            text,
            max_bytes=MAX_JSON_CHARS,
            max_depth=MAX_JSON_DEPTH,
            max_int_digits=MAX_INT_DIGITS,
            what="manifest",
        )
    except StrictJSONError as e:
        raise ManifestError([f"manifest: {e}"]) from None
    return from_json_dict(d)


# ---------------------------------------------------------------- compatibility
@dataclass(frozen=True, slots=True)
class LocalConfig:
    """What the receiver runs; validated on construction (ValueError lists every problem)."""

    model_id: str
    adapter_id: str | None
    dtype: str
    quantization: str
    num_layers: int
    kv_heads: int  # total KV heads of the model
    head_dim: int
    block_size: int
    layout: str
    rope: RopeConfig
    tp: int
    cp: int
    cache_fields: tuple[str, ...] = ("k", "v")
    # The dequantization scales of a quantized cache, as ``Manifest.kv_scales``; None: none.
    kv_scales: tuple[float, ...] | None = None
    # Bytes of the receiver's KV pool (all ranks); None: only the static MAX_PAYLOAD_BYTES.
    pool_bytes: int | None = None

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "pool_bytes"}
        renamed = {"tp": "dst_tp", "cp": "dst_cp"}
        r = _manifest_reasons({renamed.get(k, k): v for k, v in values.items()})
        r = [x.removeprefix("dst_") for x in r]  # report the local names tp and cp
        if self.pool_bytes is not None and (
            type(self.pool_bytes) is not int or not 0 < self.pool_bytes <= MAX_PAYLOAD_BYTES
        ):
            r.append(f"pool_bytes: expected an int in [1, {MAX_PAYLOAD_BYTES}]")
        if r:
            raise ValueError("; ".join(r))


@dataclass(frozen=True, slots=True)
class Verdict:
    """The receiver's answer to a manifest: install (``ok``) or refuse, and why."""

    ok: bool
    reasons: tuple[str, ...]  # every reason for refusal; empty iff ok
    conversions: tuple[str, ...]  # differing fields the receiver must convert


_MUST_MATCH: Final = (
    "model_id",
    "adapter_id",
    "dtype",
    "quantization",
    "num_layers",
    "kv_heads",
    "head_dim",
    "cache_fields",
)


def kv_scale_index(
    i: int, num_fields: int, kv_heads: int, granularity: str
) -> tuple[int, int, int | None]:
    """(layer, field, head) of scale entry ``i`` (layer-major, then field, then head; head
    None per tensor)."""
    per = kv_heads if granularity == "per_head" else 1
    layer, rest = divmod(i, num_fields * per)
    field, head = divmod(rest, per)
    return layer, field, head if granularity == "per_head" else None


def kv_scales_reason(m: Manifest, local: LocalConfig) -> str | None:
    """Why the manifest's scales are not the receiver's, naming the first differing
    (layer, field[, head]); None when they are equal (or neither side states any)."""
    theirs, ours = m.kv_scales, local.kv_scales
    if theirs == ours:
        return None
    if theirs is None or ours is None:
        side = "the local cache" if theirs is None else "the manifest"
        got = f"manifest {short(theirs)}, local {short(ours)}"
        return f"kv_scales: only {side} states scales ({got})"
    nf, heads = len(m.cache_fields), m.kv_heads
    gt = kv_scales_granularity(len(theirs), m.num_layers, nf, heads)
    go = kv_scales_granularity(len(ours), local.num_layers, len(local.cache_fields), heads)
    if gt != go or len(theirs) != len(ours):
        return f"kv_scales: manifest scales are {gt} ({len(theirs)}), local {go} ({len(ours)})"
    i = next(i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a != b)
    layer, field, head = kv_scale_index(i, nf, heads, str(gt))
    where = f"layer {layer} field {m.cache_fields[field]!r}"
    where += "" if head is None else f" head {head}"
    return f"kv_scales: {where}: manifest {theirs[i]!r} != local {ours[i]!r}"


def check_compatible(m: Manifest, local: LocalConfig) -> Verdict:
    """Apply the rule in the module docstring; list every refusal reason and conversion."""
    reasons = [
        f"{name}: manifest {getattr(m, name)!r} != local {getattr(local, name)!r}"
        for name in _MUST_MATCH
        if getattr(m, name) != getattr(local, name)
    ]
    for f in fields(RopeConfig):
        theirs, ours = getattr(m.rope, f.name), getattr(local.rope, f.name)
        if theirs != ours:
            reasons.append(f"rope.{f.name}: manifest {theirs!r} != local {ours!r}")
    scales = kv_scales_reason(m, local)
    if scales is not None:
        reasons.append(scales)
    if m.dst_tp != local.tp:
        reasons.append(f"dst_tp: manifest sharded for tp={m.dst_tp}, local runs tp={local.tp}")
    if m.dst_cp != local.cp:
        reasons.append(f"dst_cp: manifest sharded for cp={m.dst_cp}, local runs cp={local.cp}")
    if local.pool_bytes is not None and m.payload_bytes > local.pool_bytes:
        reasons.append(
            f"num_tokens: a payload of {m.payload_bytes} bytes cannot fit the local pool of"
            f" {local.pool_bytes} bytes"
        )
    conversions: list[str] = []
    if m.block_size != local.block_size:
        conversions.append(f"block_size: {m.block_size} -> {local.block_size}")
    if m.layout != local.layout:
        conversions.append(f"layout: {m.layout} -> {local.layout}")
    if m.src_tp != m.dst_tp:
        conversions.append(f"tp: {m.src_tp} -> {m.dst_tp} (reshard kv heads)")
    if m.src_cp != m.dst_cp:
        conversions.append(f"cp: {m.src_cp} -> {m.dst_cp} (reshard context)")
    return Verdict(not reasons, tuple(reasons), tuple(conversions))
