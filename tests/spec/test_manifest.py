"""Manifest validation (hostile input) and the receiver's compatibility rule."""

import json
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.errors import ManifestError as RefimplManifestError
from refimpl.errors import OwnershipError
from spec.manifest import (
    MANIFEST_FIELDS,
    MAX_TOKENS,
    LocalConfig,
    Manifest,
    ManifestError,
    RopeConfig,
    check_compatible,
    from_json,
    from_json_dict,
)
from tests.spec.hostile_manifests import GOOD_SUM, good_dict, local


def reasons_of(d: object) -> list[str]:
    with pytest.raises(ManifestError) as info:
        from_json_dict(d)
    return info.value.reasons


def named(reasons: list[str], field: str) -> bool:
    """Some reason names the field (a cross-field reason names every field involved)."""
    return any(re.search(rf"(?<![\w.]){field}\b", r) for r in reasons)


def test_round_trip_through_json_text() -> None:
    m = from_json_dict(good_dict())
    assert from_json(json.dumps(m.to_json_dict())) == m
    assert from_json(m.to_json()) == m
    assert m.num_blocks == 3 and list(m.sent_blocks) == [1, 2]
    assert m.positions == range(0, 40)
    assert m.block_bytes == 2 * 2 * 8 * 16 * 64 * 2 and m.sent_bytes == 2 * m.block_bytes


BAD_VALUES: dict[str, list[object]] = {
    "request_id": ["", 7, None, "x" * 257, "line\nbreak"],
    "model_id": ["", ["m"], "\x00"],
    "adapter_id": [5, ""],
    "token_ids": ["0123", [1.5] * 40, [-1] * 40, [True] * 40, [2**31] * 40, list(range(39))],
    "num_tokens": [0, -1, MAX_TOKENS + 1, "40", True, 40.0],
    "cache_fields": [[], ["k", "k"], ["K", "V"], "kv", [1, 2], ["a"] * 9],
    "num_layers": [0, -3, 10**9, None],
    "dtype": ["float17", "fp16", 2, "torch.float16"],
    "quantization": ["nf4", None],
    "kv_heads": [0, 2**20],
    "head_dim": [0, 4096, 32],  # 32 < rope.rotary_dim
    "block_size": [0, 10**6, 64],  # 64: the prefix block is no longer full
    "layout": ["nhd", 0, "HEADS_MAJOR"],
    "start_pos": [-1, 2**25, 2**24 - 1],
    "rope": [
        "x",
        {},
        {"theta": -1.0, "rotary_dim": 64, "scaling": "none", "scaling_factor": 1.0},
        {"theta": 1e4, "rotary_dim": 63, "scaling": "none", "scaling_factor": 1.0},
        {"theta": 1e4, "rotary_dim": 64, "scaling": "ntk?", "scaling_factor": 1.0},
        {"theta": 1e4, "rotary_dim": 64, "scaling": "none", "scaling_factor": 1.0, "x": 1},
    ],
    "src_tp": [0, 3, 2000],
    "src_cp": [0, -1],
    "dst_tp": [0, 5],
    "dst_cp": [0, "1"],
    "prefix_blocks": [-1, 3, 0],  # 0: now 3 blocks are sent but only 2 checksums given
    "block_checksums": [
        "abc",
        ["xyz"] * 2,
        [GOOD_SUM.upper()] * 2,
        [GOOD_SUM],
        [GOOD_SUM] * 3,
        [GOOD_SUM, 17],
    ],
    "version": [0, 2, "1", None, True],
    "epoch": [-1, 2**64, 1.5],
}


def test_every_field_has_bad_values() -> None:
    assert set(BAD_VALUES) == set(MANIFEST_FIELDS)


@pytest.mark.parametrize("field,bad", [(f, v) for f, vs in BAD_VALUES.items() for v in vs])
def test_each_broken_field_is_named(field: str, bad: object) -> None:
    d = good_dict()
    d[field] = bad
    assert named(reasons_of(d), field), reasons_of(d)


@pytest.mark.parametrize("field", MANIFEST_FIELDS)
def test_each_missing_field_is_named(field: str) -> None:
    d = good_dict()
    del d[field]
    assert f"{field}: missing" in reasons_of(d)


def test_several_broken_fields_are_all_listed() -> None:
    d = good_dict()
    d.update(
        dtype="float17",
        num_layers=-1,
        version=9,
        block_checksums=["nothex"] * 2,
        rope={"theta": float("inf")},
        smuggled=1,
    )
    del d["epoch"]
    r = reasons_of(d)
    for field in ("dtype", "num_layers", "version", "block_checksums", "rope", "epoch"):
        assert named(r, field), (field, r)
    assert "rope.rotary_dim: missing" in r and "'smuggled': unknown field" in r
    assert len(r) >= 9


def test_cross_field_rules() -> None:
    d = good_dict()
    d.update(quantization="fp8_e4m3")  # fp8 cannot live in float16 storage
    assert named(reasons_of(d), "dtype")
    d = good_dict()
    d.update(num_tokens=41)
    assert named(reasons_of(d), "token_ids")
    d = good_dict()
    d.update(
        num_layers=1024,
        kv_heads=1024,
        head_dim=2048,
        dtype="float32",
        src_tp=1,
        num_tokens=2**21,
        token_ids=[0] * 2**21,
        block_size=4096,
        prefix_blocks=0,
        block_checksums=[GOOD_SUM] * 512,
        rope=dict(good_dict()["rope"]),
    )  # type: ignore
    assert any("payload" in r for r in reasons_of(d))


def test_hostile_documents() -> None:
    assert reasons_of([1, 2]) == ["manifest: expected object, got list"]
    for text in ("{", '{"epoch": NaN}', "[" * 100000, " " * (2**26 + 1)):
        with pytest.raises(ManifestError):
            from_json(text)


def test_records_validate_on_construction() -> None:
    m = from_json_dict(good_dict())
    with pytest.raises(ManifestError, match="epoch"):
        replace(m, epoch=-1)
    with pytest.raises(ManifestError, match="rope.rotary_dim"):
        RopeConfig(1e4, 7)
    with pytest.raises(ValueError, match="^tp: tp=3 does not divide"):  # the same field rules
        local(tp=3)


def test_refimpl_error_is_both_families() -> None:
    err = RefimplManifestError.from_spec(ManifestError(["epoch: missing"]))
    assert isinstance(err, OwnershipError) and isinstance(err, ManifestError)
    assert err.prop == "ManifestGate" and err.reasons == ["epoch: missing"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(MANIFEST_FIELDS), value=JSON)
def test_fuzzed_field_is_accepted_or_refused_cleanly(field: str, value: object) -> None:
    d = good_dict()
    d[field] = value
    try:
        m = from_json_dict(d)
    except ManifestError as e:
        assert e.reasons
    else:
        assert from_json(m.to_json()) == m


# ---------------------------------------------------------------- compatibility
def manifest(**changes: object) -> Manifest:
    return replace(from_json_dict(good_dict()), **changes)  # type: ignore[arg-type]


def test_identical_configs_are_compatible() -> None:
    v = check_compatible(manifest(src_tp=1), local())
    assert v.ok and v.reasons == () and v.conversions == ()


MUST_MATCH = [
    ("model_id", dict(model_id="qwen")),
    ("adapter_id", dict(adapter_id="lora-7")),
    ("dtype", dict(dtype="bfloat16")),
    ("quantization", dict(quantization="fp8_e4m3", dtype="float8_e4m3fn")),
    ("num_layers", dict(num_layers=3)),
    ("kv_heads", dict(kv_heads=4)),
    ("head_dim", dict(head_dim=128)),
    ("cache_fields", dict(cache_fields=("k",))),
    ("rope", dict(rope=RopeConfig(500000.0, 64))),
    ("rope", dict(rope=RopeConfig(10000.0, 32))),
    ("rope", dict(rope=RopeConfig(10000.0, 64, "yarn", 4.0))),
    ("dst_tp", dict(tp=2)),
    ("dst_cp", dict(cp=2)),
]


@pytest.mark.parametrize("field,change", MUST_MATCH)
def test_must_match_field_refused(field: str, change: dict[str, object]) -> None:
    v = check_compatible(manifest(), local(**change))
    assert not v.ok and named(list(v.reasons), field), v.reasons


def test_all_refusal_reasons_listed() -> None:
    v = check_compatible(manifest(), local(model_id="qwen", num_layers=3, tp=2))
    assert [r.split(":")[0] for r in v.reasons] == ["model_id", "num_layers", "dst_tp"]


CONVERTIBLE = [
    ("block_size", manifest(src_tp=1), local(block_size=32)),
    ("layout", manifest(src_tp=1), local(layout="tokens_major")),
    ("tp", manifest(src_tp=2, dst_tp=1), local()),
    ("cp", manifest(src_tp=1, src_cp=4), local()),
]


@pytest.mark.parametrize("field,m,loc", CONVERTIBLE)
def test_convertible_field_listed(field: str, m: Manifest, loc: LocalConfig) -> None:
    v = check_compatible(m, loc)
    assert v.ok and v.reasons == ()
    assert [c.split(":")[0] for c in v.conversions] == [field]
