"""Every pair of behaviours composes (issue #32 item 1): the smallest world of each pair
of Config switches, fault kinds and sizes (``spec.behaviours.compose.smallest``) is
explored whole, and every property and INVARIANTS.md conjunct holds in it. The pairs
this sweep broke when it was written (SPEC.md, "Behaviours that compose") are pinned
as worlds of their own (``pair_crash_turns``, ``pair_crash_retract``,
``pair_prefix_layers``)."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest

from model_checks.explicit import runner
from spec.behaviours.compose import BEHAVIOURS, smallest
from spec.config import CONFIGS, FAULT_KINDS, Config

Item = tuple[tuple[str, ...], tuple[str, ...], dict[str, Any]]  # behaviours, faults, sizes
ITEMS: dict[str, Item] = {
    **{b: ((b,), (), {}) for b in BEHAVIOURS},
    **{f"fault:{k}": ((), (k,), {}) for k in sorted(FAULT_KINDS)},
    "layers": ((), (), {"layers": 1}),  # streamed offers (spec/stream)
    "two_attempts": ((), (), {"max_attempts": 2}),
    "two_faults": ((), ("crash", "lose"), {"faults": 2}),
}
# not a pair: one switch twice, or a combination Config refuses by design
SKIP = {("host_cache", "host_cache_warm"), ("layers", "two_attempts")}
SIZES = ("two_attempts", "two_faults")  # the pairs with a larger size run nightly (about 25 CPU s)
PAIRS = [
    pytest.param(*p, id="+".join(p), marks=[pytest.mark.nightly] if set(p) & set(SIZES) else [])
    for p in combinations(ITEMS, 2)
    if p not in SKIP
]


def pair_world(a: str, b: str) -> Config:
    (ba, fa, sa), (bb, fb, sb) = ITEMS[a], ITEMS[b]
    return smallest([*ba, *bb], [*fa, *fb], **{**sa, **sb})


def test_every_switch_fault_and_size_is_paired() -> None:
    assert len(ITEMS) == len(BEHAVIOURS) + len(FAULT_KINDS) + 3
    assert len(PAIRS) == len(ITEMS) * (len(ITEMS) - 1) // 2 - len(SKIP)


@pytest.mark.parametrize("a,b", PAIRS)
def test_each_pair_holds_every_property(a: str, b: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c = pair_world(a, b)
    monkeypatch.setitem(CONFIGS, c.name, c)
    r = runner.check_config(c.name)
    assert r.graph.n_states > 1
    assert not r.violations, {p: [s["action"] for s in v.steps] for p, v in r.violations.items()}


def test_a_warm_host_cache_that_does_not_fit_its_pool_is_refused() -> None:
    """Its initial state would break CapacityRefcount (what the sweep first found)."""
    with pytest.raises(ValueError, match=r"warm host cache \(host_cache=2\) does not fit in cap_h"):
        Config("x", "x", blocks=2, cap_h=1, host_cache=2)
    assert smallest(["host_cache_warm", "window"], []).cap_h == 2
