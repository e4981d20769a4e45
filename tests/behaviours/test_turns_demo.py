"""The two-turn PPD path of `kvown demo` (refimpl/demo/turns.py): turn 2 appended on the
decode worker from the longest common prefix is bit-exact against the unbroken run, with
and without a divergent tail to cut; without the cut (the spec mutant) it is not."""

from __future__ import annotations

import pytest
import torch

from refimpl.demo.paths import DEMO_CONFIG
from refimpl.demo.turns import TURN_PATHS, run_turns
from refimpl.model import ContiguousKV, PagedKV

STEPS = 3


@pytest.mark.parametrize("divergent", [False, True])
def test_two_turns_bit_exact(divergent: bool) -> None:
    r = run_turns(divergent, steps=STEPS)
    assert r.name == TURN_PATHS[int(divergent)]
    assert r.logits_equal and r.max_abs_diff == 0.0
    assert r.blocks_moved > 0 and r.checksums_verified > 0
    assert ("cut" in r.note) == divergent


def test_the_uncut_tail_changes_turn_two() -> None:
    r = run_turns(True, steps=STEPS, mutants=frozenset({"append_divergent_uncut"}))
    assert not r.logits_equal and "NOT cut" in r.note


def test_truncate_cuts_both_stores() -> None:
    from refimpl.demo.turns import _length, _truncate

    kv = ContiguousKV(DEMO_CONFIG)
    kv.write(0, 0, torch.zeros(DEMO_CONFIG.kv_heads, 5, DEMO_CONFIG.head_dim),
             torch.zeros(DEMO_CONFIG.kv_heads, 5, DEMO_CONFIG.head_dim))  # fmt: skip
    _truncate(kv, 3)
    assert kv.k[0].shape[1] == 3
    p = PagedKV.empty(DEMO_CONFIG, "heads_major", 4, 16)
    p.kv.num_tokens = 9
    _truncate(p, 4)
    assert _length(p) == 4
