"""RoPE in the manifest: style (neox / gptj) and scaling parameters, one RopeConfig."""

from __future__ import annotations

import pytest

from spec.manifest import ManifestError, RopeConfig, check_compatible, from_json_dict, rope_reasons
from tests.spec.test_manifest import good_dict, local

LLAMA3 = RopeConfig(500000.0, 64, "llama3", 8.0, "neox", 1.0, 4.0, 8192)


def test_a_manifest_without_the_new_fields_still_parses_as_neox_unscaled() -> None:
    m = from_json_dict(good_dict())
    assert (m.rope.style, m.rope.low_freq_factor, m.rope.original_max_position) == (
        "neox",
        None,
        None,
    )


def test_llama3_scaling_round_trips_through_json() -> None:
    d = {**good_dict(), "rope": LLAMA3.to_json_dict()}
    assert from_json_dict(d).rope == LLAMA3


@pytest.mark.parametrize(
    ("theirs", "field"),
    [
        (RopeConfig(10000.0, 64, style="gptj"), "rope.style"),
        (RopeConfig(10000.0, 64, "linear", 2.0), "rope.scaling"),
        (LLAMA3, "rope.low_freq_factor"),
    ],
)
def test_a_rope_difference_is_refused_naming_the_field(theirs: RopeConfig, field: str) -> None:
    m = from_json_dict({**good_dict(), "rope": theirs.to_json_dict()})
    verdict = check_compatible(m, local())
    assert not verdict.ok and any(r.startswith(field) for r in verdict.reasons)


@pytest.mark.parametrize(
    ("rope", "reason"),
    [
        ({"style": "rotate"}, "rope.style: unknown style 'rotate'"),
        ({"scaling": "llama3", "scaling_factor": 8.0}, "rope.low_freq_factor: missing"),
        ({"scaling_factor": 2.0}, "rope.scaling_factor: 2.0 with scaling 'none' is ignored"),
        ({"scaling": "yarn", "low_freq_factor": 1.0}, "rope.low_freq_factor: not read by"),
        ({"original_max_position": 0, "scaling": "yarn"}, "rope.original_max_position: 0 outside"),
    ],
)
def test_bad_rope_parameters_are_named(rope: dict[str, object], reason: str) -> None:
    d = {"theta": 1e4, "rotary_dim": 64, "scaling": "none", "scaling_factor": 1.0, **rope}
    assert any(r.startswith(reason) for r in rope_reasons(d)), rope_reasons(d)


def test_llama3_frequency_factors_must_be_ordered() -> None:
    with pytest.raises(ManifestError, match="must be below high_freq_factor"):
        RopeConfig(500000.0, 64, "llama3", 8.0, "neox", 4.0, 1.0, 8192)
