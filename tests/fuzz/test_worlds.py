"""The combined worlds (``refimpl.testing.worlds``) on the correct engine, under the
loaded profile with fewer examples than the default configs get (they add to the
suite's time), and the block-table fuzz of the data path."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import get_state_machine_test

from refimpl.testing import Coverage, EngineAdapter, make_machine
from refimpl.testing.datapath import PROPERTIES
from refimpl.testing.run import machine_settings
from refimpl.testing.worlds import COMBINED, FUZZ_WORLDS, get_world
from spec.config import DEFAULT_SUITE
from tests.conftest import suite_examples

EXAMPLES = 30  # per combined world, nightly (the suite: tests/conftest.py's SUITE_EXAMPLES)
_N = suite_examples() or min(EXAMPLES, settings.default.max_examples)

for _name, _c in COMBINED.items():
    globals()[f"test_the_engine_conforms_on_{_name}"] = get_state_machine_test(
        make_machine(EngineAdapter(), _c, coverage=Coverage()),
        settings=machine_settings(max_examples=_N),
    )


def test_the_worlds_cover_the_feature_pairs() -> None:
    cs = [get_world(n) for n in FUZZ_WORLDS]
    assert FUZZ_WORLDS[: len(DEFAULT_SUITE)] == DEFAULT_SUITE
    assert any(0 < c.prefix < c.blocks for c in cs)
    assert any(c.prefix and c.faults and "crash" in c.fault_kinds for c in cs)
    assert any(c.offload and c.handoff for c in cs)
    assert any(c.src_tp > 1 and c.dst_tp > 1 for c in cs)
    assert any(c.faults >= 2 for c in cs)
    with pytest.raises(KeyError, match="valid worlds"):
        get_world("nope")


@pytest.mark.parametrize("prop", PROPERTIES, ids=[p.__name__ for p in PROPERTIES])
def test_the_data_path_agrees_on_permuted_block_tables(prop: object) -> None:
    prop()  # type: ignore[operator]
