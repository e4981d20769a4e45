"""Hostile manifests: every generated document (>= 500) and every Hypothesis example is
refused with the spec's ManifestError, never another exception, never accepted when
malformed, with short printable reasons. The engine refuses them too, without raising."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.manifest import (
    MANIFEST_FIELDS,
    MAX_PAYLOAD_BYTES,
    Manifest,
    ManifestError,
    RopeConfig,
    check_compatible,
    from_json,
)
from spec.strict_json import StrictJSONError, loads_strict, short
from tests.spec.hostile_manifests import MAX_REASON, good_dict, hostile_documents, local, refused

DOCS = list(hostile_documents())


def test_the_generator_is_large_and_the_good_manifest_passes() -> None:
    assert len(DOCS) >= 500
    assert len({label for label, _ in DOCS}) == len(DOCS)
    assert from_json(json.dumps(good_dict())).num_tokens == 40


def test_every_hostile_document_is_refused_cleanly() -> None:
    escaped = []
    for label, doc in DOCS:
        try:
            refused(doc)
        except BaseException as exc:  # noqa: BLE001 - collect them all, report at once
            escaped.append(f"{label}: {type(exc).__name__}: {short(str(exc), 80)}")
    assert escaped == []


@pytest.mark.parametrize("field", ["theta", "scaling_factor"])
def test_huge_rope_numbers_are_range_checked_before_float(field: str) -> None:
    d = good_dict()
    rope = d["rope"]
    assert isinstance(rope, dict)
    rope[field] = 10**400  # float() of it raises OverflowError
    assert any(f"rope.{field}" in r for r in refused(d).reasons)
    with pytest.raises(ManifestError):
        RopeConfig(10.0**3, 64, "none", 10**400)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", MANIFEST_FIELDS)
@pytest.mark.parametrize(
    "value",
    [True, float("nan"), float("inf"), 10**5000, -1, object(), b"x", {1, 2}],
    ids=["true", "nan", "inf", "10**5000", "-1", "object", "bytes", "set"],
)
def test_from_json_dict_refuses_python_values(name: str, value: object) -> None:
    d = good_dict()
    d[name] = value
    refused(d)


def test_duplicate_keys_never_let_the_last_one_win() -> None:
    text = json.dumps(good_dict())
    trap = text.replace('"version": ', '"version": 99, "version": ', 1)
    assert any("duplicate key 'version'" in r for r in refused(trap).reasons)


def test_booleans_are_not_integers() -> None:
    for name in ("version", "num_layers", "epoch", "start_pos"):
        d = good_dict()
        d[name] = True if name != "start_pos" else False
        refused(d)


def test_strict_json_limits() -> None:
    lim = {"max_bytes": 1 << 16, "max_int_digits": 3}
    assert loads_strict('{"a": [1, 2]}', max_depth=2, **lim) == {"a": [1, 2]}
    for text, what in [
        ('{"a": [[1]]}', "nested deeper"),
        ('{"a": 1234}', "integer literal"),
        ('{"a": 1, "a": 1}', "duplicate key"),
        ('{"a": NaN}', "non-finite"),
        ('{"a": 1e999}', "overflows"),
        ('{"a": "[[[[["}', None),  # brackets inside strings do not count
    ]:
        if what is None:
            assert loads_strict(text, max_depth=1, **lim) == {"a": "[[[[["}
            continue
        with pytest.raises(StrictJSONError, match=what):
            loads_strict(text, max_depth=2, **lim)


def test_the_payload_cap_follows_the_local_pool() -> None:
    m = from_json(json.dumps(good_dict()))
    need = m.payload_bytes  # 3 blocks of 2 layers x 2 fields x 8 heads x 16 x 64 x 2 bytes
    assert need == 3 * 2 * 2 * 8 * 16 * 64 * 2
    assert check_compatible(m, local(pool_bytes=need)).ok
    refused = check_compatible(m, local(pool_bytes=need - 1))
    assert not refused.ok and "cannot fit the local pool" in refused.reasons[0]
    assert check_compatible(m, local()).ok  # no pool given: the static cap only
    for bad in (0, -1, True, MAX_PAYLOAD_BYTES + 1):
        with pytest.raises(ValueError, match="pool_bytes"):
            local(pool_bytes=bad)


def test_the_engine_refuses_a_malformed_handoff_manifest_without_raising() -> None:
    from refimpl.engine import Engine
    from spec.config import CONFIGS

    eng = Engine(CONFIGS["handoff_tp2to1"])
    for label, doc in DOCS[::7]:
        manifest: object = doc
        if isinstance(doc, str) and len(doc) < 1 << 20:
            try:
                manifest = json.loads(doc)
            except (ValueError, RecursionError):
                pass  # sent as the string itself
        text = json.dumps({"kind": "Handoff", "epoch": 1, "idx": 0, "manifest": manifest})
        assert eng.manifest_refusals(text), label


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(MANIFEST_FIELDS), JSON)
def test_any_json_value_in_any_field_is_judged_cleanly(name: str, value: object) -> None:
    d = good_dict()
    d[name] = value
    try:
        m = from_json(json.dumps(d))
    except ManifestError as e:
        assert all(len(r) <= MAX_REASON and r.isprintable() for r in e.reasons)
        return
    assert isinstance(m, Manifest)
    if name == "rope":
        assert m.rope.to_json_dict() == value
        return
    want = tuple(value) if isinstance(value, list) else value
    got = getattr(m, name)
    assert got == want and type(got) is type(want)  # accepted as given: no coercion
    assert from_json(m.to_json()) == m


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_text_is_refused_cleanly(doc: str | bytes) -> None:
    refused(doc)
