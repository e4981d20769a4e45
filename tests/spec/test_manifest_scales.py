"""The optional ``kv_scales`` field: absent keeps today's format byte for byte; given, it
is checked as hostile input (shape, finite, bounded, only on a quantized cache) and the
receiver refuses scales other than its own, naming the first differing layer and field."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.manifest import (
    MANIFEST_FIELDS,
    MAX_KV_SCALE,
    MIN_KV_SCALE,
    LocalConfig,
    ManifestError,
    check_compatible,
    from_json,
    from_json_dict,
)
from tests.spec.hostile_manifests import BAD_LITERALS, _doc, good_dict, local

# 2 layers x ("k", "v"): per tensor 4 scales, per head (8 kv heads) 32.
PER_TENSOR = [0.5, 0.25, 0.125, 2.0]


def fp8(**changes: object) -> dict[str, object]:
    d = good_dict()
    d.update(dtype="float8_e4m3fn", quantization="fp8_e4m3", kv_scales=list(PER_TENSOR))
    d.update(changes)
    return d


def fp8_local(scales: tuple[float, ...] | None = tuple(PER_TENSOR)) -> LocalConfig:
    return local(dtype="float8_e4m3fn", quantization="fp8_e4m3", kv_scales=scales)


def reasons(d: dict[str, object]) -> list[str]:
    with pytest.raises(ManifestError) as info:
        from_json(json.dumps(d))
    return info.value.reasons


def test_a_manifest_without_scales_is_todays_format() -> None:
    d = good_dict()
    m = from_json_dict(d)
    assert m.kv_scales is None
    out = m.to_json_dict()
    assert list(out) == list(MANIFEST_FIELDS) == list(d)  # the same keys, in order
    assert {**out, "rope": None} == {**d, "rope": None} and "kv_scales" not in m.to_json()
    assert "kv_scales" not in MANIFEST_FIELDS  # never "missing"
    assert from_json_dict({**d, "kv_scales": None}) == m  # null: absent


@pytest.mark.parametrize("scales", [PER_TENSOR, [1.0] * 32, [1, 2, 3, 4]])
def test_scales_round_trip(scales: list[float]) -> None:
    m = from_json_dict(fp8(kv_scales=scales))
    assert m.kv_scales == tuple(scales)
    assert from_json(m.to_json()) == m


HOSTILE_SCALES: list[object] = [
    [],  # no scales is "absent", not an empty list
    "0.5",
    {"k": 0.5},
    [0.5, 0.25, 0.125],  # not layers x fields
    [0.5] * 5,
    [0.5] * 33,
    [0.5, 0.25, 0.125, 0.0],
    [0.5, 0.25, 0.125, -1.0],
    [0.5, 0.25, 0.125, MIN_KV_SCALE / 2],  # subnormal in float32
    [0.5, 0.25, 0.125, MAX_KV_SCALE * 2],
    [0.5, 0.25, 0.125, 10**400],  # range-checked before any float()
    [0.5, 0.25, 0.125, True],
    [0.5, 0.25, 0.125, None],
    [0.5, 0.25, 0.125, "1"],
    [0.5, 0.25, 0.125, [1.0]],
    [0.5] * (1024 * 8 * 1024 + 1),  # past the cap, refused by length alone
]


@pytest.mark.parametrize("bad", HOSTILE_SCALES, ids=range(len(HOSTILE_SCALES)))
def test_hostile_scales_are_refused_by_name(bad: object) -> None:
    with pytest.raises(ManifestError) as info:
        from_json_dict(fp8(kv_scales=bad))
    assert any(r.startswith("kv_scales:") for r in info.value.reasons), info.value.reasons


@pytest.mark.parametrize("lit", [*BAD_LITERALS, "[NaN,1,1,1]", "[1,1,1,Infinity]", "[1,1,1,1e400]"])
def test_hostile_json_literals_are_refused(lit: str) -> None:
    with pytest.raises(ManifestError):
        from_json(_doc(fp8(), "kv_scales", lit, rope=False))


def test_scales_on_a_cache_that_is_not_quantized_are_refused_by_name() -> None:
    d = good_dict()
    d["kv_scales"] = list(PER_TENSOR)
    assert any("quantization 'none'" in r for r in reasons(d))
    with pytest.raises(ValueError, match="kv_scales"):
        local(kv_scales=tuple(PER_TENSOR))


def test_equal_scales_are_compatible() -> None:
    m = from_json_dict(fp8())
    assert check_compatible(m, fp8_local()).ok
    per_head = tuple(float(i + 1) for i in range(32))
    m = from_json_dict(fp8(kv_scales=list(per_head)))
    assert check_compatible(m, fp8_local(per_head)).ok


def test_the_first_differing_layer_and_field_is_named() -> None:
    m = from_json_dict(fp8())
    theirs = list(PER_TENSOR)
    theirs[3] = 4.0  # layer 1, field "v"
    v = check_compatible(m, fp8_local(tuple(theirs)))
    assert not v.ok
    assert v.reasons == ("kv_scales: layer 1 field 'v': manifest 2.0 != local 4.0",)
    per_head = [1.0] * 32
    m = from_json_dict(fp8(kv_scales=per_head))
    ours = list(per_head)
    ours[8 + 5] = 3.0  # layer 0, field "v", head 5
    (r,) = check_compatible(m, fp8_local(tuple(ours))).reasons
    assert r == "kv_scales: layer 0 field 'v' head 5: manifest 1.0 != local 3.0"


def test_scales_stated_by_one_side_only_or_another_granularity_are_refused() -> None:
    m = from_json_dict(fp8())
    (r,) = check_compatible(m, fp8_local(None)).reasons
    assert r.startswith("kv_scales: only the manifest states scales")
    m0 = replace(m, kv_scales=None)
    (r,) = check_compatible(m0, fp8_local()).reasons
    assert r.startswith("kv_scales: only the local cache states scales")
    (r,) = check_compatible(m, fp8_local((1.0,) * 32)).reasons
    assert r.startswith("kv_scales: manifest scales are per_tensor (4), local per_head (32)")
    assert check_compatible(m0, fp8_local(None)).ok  # neither: today's fp8 handoff


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, min_size=0, max_size=5) | st.dictionaries(st.text(), kids),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(JSON | st.lists(st.floats(), min_size=4, max_size=4))
def test_any_json_value_as_scales_is_judged_cleanly(value: object) -> None:
    try:
        m = from_json(json.dumps(fp8(kv_scales=value)))
    except ManifestError as e:
        assert all(r.isprintable() and len(r) <= 400 for r in e.reasons)
        return
    if value is None:
        assert m.kv_scales is None
        return
    assert isinstance(value, list) and m.kv_scales == tuple(value)  # accepted as given
    assert all(MIN_KV_SCALE <= x <= MAX_KV_SCALE for x in m.kv_scales)
    assert from_json(m.to_json()) == m
