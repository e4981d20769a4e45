"""Every cap on a manifest's sizes, at its edge: the cap itself is accepted, one past it is
refused naming the field. SPEC.md's table of caps and the code are kept equal here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import spec.manifest_fields as mf
from spec.manifest import ManifestError, from_json_dict
from tests.spec.hostile_manifests import GOOD_SUM, good_dict, refused

SPEC = Path(__file__).resolve().parents[2] / "spec" / "SPEC.md"


def test_spec_md_lists_every_cap_with_its_value() -> None:
    text = SPEC.read_text()
    section = text[text.index("### Manifest caps") :]
    rows = dict(re.findall(r"^\| `(MAX_[A-Z_]+)` \| ([0-9,]+) \|", section, re.M))
    caps = {n: v for n, v in vars(mf).items() if n.startswith("MAX_") and type(v) is int}
    assert {n: int(v.replace(",", "")) for n, v in rows.items()} == caps


def _with(**changes: Any) -> dict[str, Any]:
    """good_dict with fields changed, the token counts kept consistent."""
    d: dict[str, Any] = {**good_dict(), "prefix_blocks": 0, **changes}
    n, bs = d["num_tokens"], d["block_size"]
    if "token_ids" not in changes:
        d["token_ids"] = [7] * n
    if "block_checksums" not in changes and type(bs) is int and bs > 0:
        d["block_checksums"] = [GOOD_SUM] * (-(-n // bs) - d["prefix_blocks"])
    return d


def _refused_for(d: dict[str, Any]) -> str:
    return "; ".join(refused(d).reasons)


@pytest.mark.parametrize("field", ["request_id", "model_id", "adapter_id"])
def test_ids_of_1_to_256_printable_characters(field: str) -> None:
    for ok in ("x", "x" * mf.MAX_ID_CHARS):
        assert getattr(from_json_dict(_with(**{field: ok})), field) == ok
    for bad in ("", "x" * (mf.MAX_ID_CHARS + 1), "tab\there"):
        assert field in _refused_for(_with(**{field: bad}))


@pytest.mark.parametrize(
    ("field", "lo", "hi"),
    [
        ("num_layers", 1, mf.MAX_LAYERS),
        ("kv_heads", 1, mf.MAX_KV_HEADS),
        ("head_dim", 1, mf.MAX_HEAD_DIM),
        ("block_size", 1, mf.MAX_BLOCK_SIZE),
        ("start_pos", 0, mf.MAX_POSITION),
        ("src_tp", 1, mf.MAX_PARALLEL),
        ("epoch", 0, mf.MAX_EPOCH),
    ],
)
def test_each_count_is_range_checked_at_both_ends(field: str, lo: int, hi: int) -> None:
    for bad in (lo - 1, hi + 1):
        assert f"{field}: {bad} outside [{lo}, {hi}]" in _refused_for(_with(**{field: bad}))
    for edge in (lo, hi):  # other rules may refuse it (positions past the cap), not this one
        assert "outside" not in (_refused_or_none(_with(**{field: edge})) or "")


def _refused_or_none(d: dict[str, Any]) -> str | None:
    try:
        from_json_dict(d)
    except ManifestError as e:
        return "; ".join(e.reasons)
    return None


def test_num_tokens_is_at_least_1_and_prefix_blocks_at_least_0() -> None:
    assert "num_tokens" in _refused_for(_with(num_tokens=0, token_ids=[], block_checksums=[]))
    assert from_json_dict(_with(prefix_blocks=0)).prefix_blocks == 0
    assert "prefix_blocks" in _refused_for(_with(prefix_blocks=-1))


def test_cache_fields_1_to_8_distinct_names() -> None:
    eight = [f"f{i}" for i in range(mf.MAX_CACHE_FIELDS)]
    assert from_json_dict(_with(cache_fields=eight)).cache_fields == tuple(eight)
    for bad in ([], [*eight, "f9"], ["k", "k"]):
        assert "cache_fields" in _refused_for(_with(cache_fields=bad))


def test_token_ids_must_count_num_tokens() -> None:
    assert "token_ids" in _refused_for(_with(num_tokens=40, token_ids=[7] * 39))


def test_the_token_cap() -> None:
    big = mf.MAX_TOKENS
    m = from_json_dict(_with(num_tokens=big, block_size=mf.MAX_BLOCK_SIZE, num_layers=1))
    assert m.num_tokens == big and len(m.token_ids) == big
    over = _with(num_tokens=big + 1, block_size=mf.MAX_BLOCK_SIZE, num_layers=1)
    assert "num_tokens" in _refused_for(over) and "token_ids" in _refused_for(over)


def test_the_payload_cap_is_1_tib_exactly() -> None:
    # 2^19 tokens x 1024 layers x 2 fields x 8 heads x 64 dims x 2 bytes = 2^40 bytes
    at_cap = dict(num_tokens=1 << 19, num_layers=1024, block_size=mf.MAX_BLOCK_SIZE)
    assert from_json_dict(_with(**at_cap)).num_tokens == 1 << 19
    over = _refused_for(_with(**{**at_cap, "num_tokens": (1 << 19) + 1}))
    assert f"exceeds the cap {mf.MAX_PAYLOAD_BYTES}" in over
