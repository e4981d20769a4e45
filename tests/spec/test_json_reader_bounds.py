"""The one reader of untrusted JSON (``spec.strict_json.loads_strict``) on hostile text:
whatever the document, it answers with a value or one ``StrictJSONError``, and its peak
memory (``tracemalloc``, which sees the regex engine's stack) is a small multiple of the
document's size. Time is linear too; ``benchmarks/hostile_readers.py`` measures it (no
timed assert here). Before issue #34 the depth pre-scan backtracked from every quote of a
run of escaped quotes: about 120 bytes per character, quadratic time (42 s for 64 KB)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.strict_json import StrictJSONError, loads_strict

CAP = 1 << 20


def _read(text: str | bytes, **kw: int) -> object:
    limits = {"max_bytes": CAP, "max_depth": 8, "max_int_digits": 20, **kw}
    return loads_strict(text, **limits)


def _peak(fn: Callable[[], object]) -> int:
    """Peak traced bytes while ``fn`` runs (its result or refusal dropped)."""
    tracemalloc.start()
    try:
        try:
            fn()
        except StrictJSONError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


HOSTILE = {
    "escaped quotes, unterminated": '["' + '\\"' * 16_000,
    "escaped quotes, closed": '["' + '\\"' * 16_000 + '"]',
    "quote runs outside a string": "[" + '\\"' * 16_000 + "]",
    "unbalanced openers": "[" * 32_000,
    "unbalanced closers": "]" * 32_000,
    "empty pairs": "[" + "[]," * 10_000 + "[]]",
    "deep then junk": "[" * 7 + "{" * 5 + "}" * 3 + '"' * 9_000,
    "many keys": "{" + ",".join(f'"k{i}":1' for i in range(4_000)) + "}",
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_a_hostile_document_costs_a_small_multiple_of_its_size(what: str) -> None:
    text = HOSTILE[what]
    peak = _peak(lambda: _read(text, max_items=1_000))
    assert peak <= 12 * len(text) + 64_000, f"{what}: {peak} bytes for {len(text)}"


@pytest.mark.parametrize("text", ["[" * (4 << 20), "{}" * (2 << 20)], ids=["openers", "pairs"])
def test_a_large_bracket_document_costs_two_copies_of_itself_not_three(text: str) -> None:
    """Its skeleton is as long as it is: the slices of the skeleton were joined beside the
    result (3 copies at once; ``kvown replay`` took 328 MB for 60 MB of brackets)."""
    peak = _peak(lambda: _read(text, max_bytes=8 << 20))
    assert peak <= 2.5 * len(text) + (1 << 20), f"{peak} bytes for {len(text)}"


def test_the_size_cap_is_named_and_checked_before_decoding() -> None:
    with pytest.raises(StrictJSONError, match="header of 17 bytes is longer than the cap of 16"):
        loads_strict(b"\xff" * 17, max_bytes=16, max_depth=2, max_int_digits=3, what="header")
    with pytest.raises(StrictJSONError, match="not UTF-8"):
        loads_strict(b"\xff" * 16, max_bytes=16, max_depth=2, max_int_digits=3)
    wide = "\u00e9" * 10  # 20 bytes of UTF-8 in 10 characters
    with pytest.raises(StrictJSONError, match="20 bytes"):
        loads_strict(wide, max_bytes=16, max_depth=2, max_int_digits=3)


def test_the_member_count_is_checked_before_parsing() -> None:
    doc = "{" + ",".join(f'"k{i}":"a,b:c"' for i in range(100)) + "}"
    assert len(_read(doc, max_items=199)) == 100  # type: ignore[arg-type]
    with pytest.raises(StrictJSONError, match="more than 198 members and elements"):
        _read(doc, max_items=198)


def test_unbalanced_brackets_are_bad_json_not_deep() -> None:
    with pytest.raises(StrictJSONError, match="bad JSON"):
        _read('{"a": [' + "[], " * 10)  # 11 openers, 2 deep, never closed


# ------------------------------------------------------------------ properties
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**18), 10**18),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_doc = st.recursive(
    _scalar,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=30,
)
_piece = st.sampled_from(
    ['"', "\\", '\\"', "[", "]", "{", "}", ",", ":", "1", "e9", "x", " ", "\u00e9"]
)


def _depth(v: object) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(_doc)
def test_a_valid_document_within_the_limits_reads_as_json_does(v: object) -> None:
    text = json.dumps(v)
    if _depth(v) <= 8:
        assert _read(text) == json.loads(text)
    else:
        with pytest.raises(StrictJSONError, match="nested deeper than 8"):
            _read(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(_piece, max_size=400), st.integers(1, 200))
def test_any_text_is_a_value_or_one_refusal(pieces: list[str], repeat: int) -> None:
    text = "".join(pieces) * repeat
    try:
        _read(text, max_items=50)
    except StrictJSONError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 200
    assert _peak(lambda: _read(text, max_items=50)) <= 12 * len(text.encode()) + 64_000
