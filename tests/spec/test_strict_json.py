"""spec/strict_json.py at its boundaries: the longest literal each limit allows is read,
one character more is refused; quoted values are short, printable ASCII."""

from __future__ import annotations

import json

import pytest

from spec.manifest import ManifestError, from_json
from spec.strict_json import (
    MAX_FLOAT_CHARS,
    QUOTE_CHARS,
    StrictJSONError,
    loads_strict,
    nesting_depth,
    short,
)
from tests.spec.hostile_manifests import good_dict


def _loads(text: str) -> object:
    return loads_strict(text, max_bytes=1 << 16, max_depth=3, max_int_digits=3)


@pytest.mark.parametrize("lit", ["999", "-999", "0", "-0"])
def test_integers_up_to_the_digit_limit_are_read(lit: str) -> None:
    assert _loads(f"[{lit}]") == [int(lit)]


@pytest.mark.parametrize("lit", ["1000", "-1000", "9999"])
def test_one_digit_more_is_refused(lit: str) -> None:
    with pytest.raises(StrictJSONError, match=f"integer literal of {len(lit)} characters"):
        _loads(f"[{lit}]")


def test_float_literals_up_to_the_length_limit_are_read() -> None:
    fits = "0." + "0" * (MAX_FLOAT_CHARS - 3) + "5"
    assert len(fits) == MAX_FLOAT_CHARS and _loads(f"[{fits}]") == [float(fits)]
    with pytest.raises(StrictJSONError, match=f"{MAX_FLOAT_CHARS + 1} characters"):
        _loads(f"[{fits}5]")


def test_nesting_depth_stops_one_past_the_limit() -> None:
    assert nesting_depth("[[]] [[[]]]", 5) == 3
    assert nesting_depth("[" * 1000, 2) == 3  # no need to read the rest
    assert nesting_depth('["[[[[", {"a": "}}}"}]', 9) == 2  # strings are not brackets
    assert _loads("[[[1]]]") == [[[1]]]
    with pytest.raises(StrictJSONError, match="nested deeper than 3"):
        _loads("[[[[1]]]]")


def test_short_quotes_a_printable_ascii_prefix() -> None:
    assert short("abc") == "'abc'"
    assert short("x" * (QUOTE_CHARS - 2)) == "'" + "x" * (QUOTE_CHARS - 2) + "'"
    cut = short("y" * 10_000)
    assert len(cut) == QUOTE_CHARS and cut.endswith("...")
    assert short("\u00e9\x00") == "'\\xe9\\x00'"  # escaped, never raw
    assert short(7) == "7" and short(-(10**30)) == str(-(10**30))
    assert short(10**5000) == f"<int of {(10**5000).bit_length()} bits>"  # repr would raise
    assert short(2**170) == "<int of 171 bits>"  # past 4 bits per quoted character

    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert short(Hostile()) == "<Hostile>"
    assert short("tab\tnew\nline", 80) == "'tab\\tnew\\nline'"


def test_a_manifest_that_is_not_text_is_refused_by_name() -> None:
    for bad in (123, None, ["{}"], {"version": 1}):
        with pytest.raises(ManifestError, match="manifest"):
            from_json(bad)  # type: ignore[arg-type]


def test_a_manifest_round_trips_through_json() -> None:
    m = from_json(json.dumps(good_dict()))
    d = m.to_json_dict()
    assert json.loads(json.dumps(d)) == d  # only JSON types: lists, not tuples
    assert from_json(json.dumps(d)) == m
