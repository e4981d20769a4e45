"""A generator of hostile manifest documents: every field (and every rope field) given
each of a list of values no field accepts, each key given twice, truncations, non-objects,
bad encodings and bombs. Every document it yields must be refused with ManifestError."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from spec.manifest import (
    MANIFEST_FIELDS,
    MANIFEST_VERSION,
    LocalConfig,
    ManifestError,
    RopeConfig,
    from_json,
    from_json_dict,
)
from spec.strict_json import short

GOOD_SUM = "0123456789abcdef"
ROPE_FIELDS = ("theta", "rotary_dim", "scaling", "scaling_factor")


def good_dict() -> dict[str, object]:
    """40 tokens at block size 16: 3 blocks, the first held by the receiver, 2 sent."""
    return {
        "request_id": "req-1",
        "model_id": "llama-3-8b",
        "adapter_id": None,
        "token_ids": list(range(100, 140)),
        "num_tokens": 40,
        "cache_fields": ["k", "v"],
        "num_layers": 2,
        "dtype": "float16",
        "quantization": "none",
        "kv_heads": 8,
        "head_dim": 64,
        "block_size": 16,
        "layout": "heads_major",
        "start_pos": 0,
        "rope": {"theta": 10000.0, "rotary_dim": 64, "scaling": "none", "scaling_factor": 1.0},
        "src_tp": 2,
        "src_cp": 1,
        "dst_tp": 1,
        "dst_cp": 1,
        "prefix_blocks": 1,
        "block_checksums": [GOOD_SUM, "fedcba9876543210"],
        "version": MANIFEST_VERSION,
        "epoch": 3,
    }


# JSON literals that no manifest field accepts (null is added for the non-null fields).
BAD_LITERALS: tuple[str, ...] = (
    "true",
    "false",
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "-1",
    "-1.5",
    "0.0",
    "1" + "0" * 400,  # past the float range: float() would raise OverflowError
    "9" * 5000,  # past Python's 4,300-digit int() limit
    "18446744073709551616",  # 2**64
    "[]",
    "{}",
    "[" * 1000 + "]" * 1000,  # RecursionError bait
    '{"a":' * 600 + "1" + "}" * 600,
    '""',
    '"\\u0000"',
    '"\\ud800"',  # a lone surrogate
    '"' + "x" * 100_000 + '"',
    '"\\n\\u001b[31mred"',  # a terminal escape in a value
)


def _doc(d: dict[str, object], field: str, literal: str, rope: bool) -> str:
    """The JSON text of ``d`` with ``field`` (of rope, if ``rope``) set to ``literal``."""
    marker = "__HOSTILE__"
    target = d["rope"] if rope else d
    assert isinstance(target, dict)
    target[field] = marker
    return json.dumps(d).replace(f'"{marker}"', literal)


def hostile_documents() -> Iterator[tuple[str, str | bytes]]:
    """(label, document) pairs; every one must be refused."""
    for name in MANIFEST_FIELDS:
        literals = BAD_LITERALS + (() if name == "adapter_id" else ("null",))
        for lit in literals:
            yield f"{name}={lit[:20]}", _doc(good_dict(), name, lit, rope=False)
    for name in ROPE_FIELDS:
        for lit in (*BAD_LITERALS, "null"):
            yield f"rope.{name}={lit[:20]}", _doc(good_dict(), name, lit, rope=True)
    good = json.dumps(good_dict())
    for name in (*MANIFEST_FIELDS, *(f"rope.{r}" for r in ROPE_FIELDS)):
        key = name.removeprefix("rope.")
        # the same key twice, the first value bogus, the last one valid (last-wins trap)
        yield f"dup:{name}", good.replace(f'"{key}": ', f'"{key}": "bogus", "{key}": ', 1)
    for cut in range(1, len(good), max(1, len(good) // 40)):
        yield f"truncated@{cut}", good[:cut]
    for text in ("", " ", "null", "1", '"x"', "[]", "[{}]", "true", "NaN", "\ufeff" + good):
        yield f"not an object: {text[:10]!r}", text
    yield "unknown field", good[:-1] + ', "extra": 1}'
    yield "unknown rope field", good.replace('"scaling": ', '"x": 1, "scaling": ', 1)
    yield "invalid utf-8", good.encode()[:-2] + b"\xff}"
    yield "too big", " " * (1 << 26) + good
    yield "trailing garbage", good + " x"
    yield "two documents", good + good


def local(**changes: object) -> LocalConfig:
    base = LocalConfig(
        model_id="llama-3-8b",
        adapter_id=None,
        dtype="float16",
        quantization="none",
        num_layers=2,
        kv_heads=8,
        head_dim=64,
        block_size=16,
        layout="heads_major",
        rope=RopeConfig(theta=10000.0, rotary_dim=64),
        tp=1,
        cp=1,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


MAX_REASON = 300  # longest reason a refusal may carry


def refused(doc: str | bytes | object) -> ManifestError:
    """The ManifestError a document (text, or an already parsed object) is refused with:
    the spec's own class, at least one reason, each short and printable."""
    with pytest.raises(ManifestError) as info:
        from_json(doc) if isinstance(doc, str | bytes) else from_json_dict(doc)
    e = info.value
    assert type(e) is ManifestError  # the spec's own class, nothing else escapes
    assert e.reasons
    for r in e.reasons:
        assert len(r) <= MAX_REASON and r.isprintable(), short(r, 80)
    return e
