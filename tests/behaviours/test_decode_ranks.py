"""Decode TP ranks (spec/behaviours/decode_ranks.py): each decode rank installs its own
shard; commit needs every rank; RankAgreement on the receiving side (state + step)."""

from __future__ import annotations

from typing import Any

import pytest

from model_checks.explicit.runner import check_config, check_mutant
from spec.actions import apply
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import CANCELLED, COMPLETE, RUNNING, WRITABLE, World
from spec.steps import check_step
from tests.spec.spec_helpers import HO, R, W, check_guard

T12 = CONFIGS["handoff_tp1to2"]
VALID = R(st=RUNNING, d=COMPLETE, ep=1, dep=1, landed=3, rmask=1)

CASES: list[tuple[str, Any, World, int, int, Any]] = [
    ("DecodeRankInstall", T12, W(VALID), 0, 0, {"dmask": 1}),
    ("DecodeRankInstall", T12, W(VALID._replace(dmask=1)), 0, 0, {"dmask": 3}),
    ("DecodeRankInstall", T12, W(VALID._replace(dmask=3)), 0, 0, ("disabled", None)),
    ("DecodeRankInstall", HO, W(VALID), 0, 0, ("disabled", None)),  # ranks not modelled
    ("DecodeRankInstall", T12, W(VALID._replace(st=CANCELLED)), 0, 0, ("refused", "StickyEnd")),
    ("DecodeCommit", T12, W(VALID._replace(dmask=1)), 0, 0, ("refused", "RankAgreement")),
    ("DecodeCommit", T12, W(VALID._replace(dmask=3)), 0, 0, {"d": WRITABLE}),
]


@pytest.mark.parametrize("name,c,w,i,arg,expected", CASES)
def test_guard(name, c, w, i, arg, expected):  # type: ignore[no-untyped-def]
    check_guard(name, c, w, i, arg, expected)


def test_existing_worlds_do_not_model_decode_ranks() -> None:
    """handoff_crash has dst_tp=2 for the data path only: commit needs no install there."""
    c = CONFIGS["handoff_crash"]
    assert c.dst_tp == 2 and not c.decode_ranks
    assert isinstance(apply(W(VALID), c, frozenset(), "DecodeCommit", 0, 0), World)


def test_state_part() -> None:
    assert "RankAgreement" in violated_safety(W(VALID._replace(d=WRITABLE, dmask=1)), T12)
    assert "RankAgreement" in violated_safety(W(R(st=RUNNING, dmask=1)), T12)  # no replica
    assert violated_safety(W(VALID._replace(d=WRITABLE, dmask=3)), T12) == []


def test_step_part_a_rank_counts_only_from_its_own_install() -> None:
    pre = W(VALID)
    post = apply(pre, T12, frozenset(), "DecodeRankInstall", 0, 0)
    assert isinstance(post, World)
    assert check_step(pre, "DecodeRankInstall", 0, 0, post, T12) == []
    # two ranks at once, or a rank gained by another action, breaks the step predicate
    two = W(VALID._replace(dmask=3))
    assert "RankAgreement" in check_step(pre, "DecodeRankInstall", 0, 0, two, T12)
    assert "RankAgreement" in check_step(pre, "DecodeValidate", 0, 0, post, T12)


def test_world_holds() -> None:
    res = check_config("handoff_tp1to2")
    assert not res.violations and res.graph.n_states > 1000


def test_mutant_caught() -> None:
    res = check_mutant("decode_runs_before_all_ranks")
    assert res.caught and res.expected == "RankAgreement"
    s = apply(
        W(VALID._replace(dmask=1)),
        T12,
        frozenset({"decode_runs_before_all_ranks"}),
        "DecodeCommit",
        0,
        0,
    )
    assert isinstance(s, World) and not isinstance(s, Refused)
    assert "RankAgreement" in violated_safety(s, T12)
