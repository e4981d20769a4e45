"""z3 layout proofs: the spec's shard maps prove; broken maps yield counterexamples."""

from __future__ import annotations

import dataclasses

import pytest

from model_checks.layouts import proofs as lp
from spec import shardmap as sm


@pytest.fixture(scope="module")
def quick_claims() -> dict[str, lp.LayoutClaim]:
    return {c.id: c for c in lp.layout_claims(quick=True)}


def test_quick_claims_prove(quick_claims: dict[str, lp.LayoutClaim]) -> None:
    for needed in (
        "layout:tp:8->2",
        "layout:tp:2->8",
        "layout:cp:4",
        "layout:block_size:16->8",
        "layout:axis_order",
    ):
        assert needed in quick_claims
    for claim in quick_claims.values():
        assert claim.method == "bijection"
        if claim.id != "layout:bug:incident3":
            assert claim.result == "proved", claim


def test_incident3_bug_is_violated_with_a_readable_counterexample(
    quick_claims: dict[str, lp.LayoutClaim],
) -> None:
    bug = quick_claims["layout:bug:incident3"]
    assert bug.result == "violated"
    assert "as heads_major hits offset" in bug.detail
    assert "head was read from the token axis" in bug.detail
    assert "kv_heads=2 block_size=2" in bug.detail


def test_dropping_a_tp_piece_breaks_write_once(monkeypatch: pytest.MonkeyPatch) -> None:
    good = sm.tp_reshard_plan
    monkeypatch.setattr(sm, "tp_reshard_plan", lambda kv, a, b: good(kv, a, b)[:-1])
    claim = lp.tp_claim(4, 2)
    assert claim.result == "violated"
    assert "write-once violated" in claim.detail


def test_reading_a_non_primary_replica_breaks_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    good = sm.tp_reshard_plan

    def from_replica(kv: int, a: int, b: int) -> list[sm.HeadPiece]:
        return [dataclasses.replace(p, src_rank=p.src_rank + 1) for p in good(kv, a, b)]

    monkeypatch.setattr(sm, "tp_reshard_plan", from_replica)
    claim = lp.tp_claim(4, 1, kv_grid=[2])  # kv=2 < tp=4: ranks 1 and 3 are replicas
    assert claim.result == "violated"
    assert "read-once violated" in claim.detail


def test_swapping_tp_sources_breaks_content(monkeypatch: pytest.MonkeyPatch) -> None:
    good = sm.tp_reshard_plan

    def swapped(kv: int, a: int, b: int) -> list[sm.HeadPiece]:
        plan = good(kv, a, b)
        first, second = plan[0], plan[1]
        return [
            dataclasses.replace(first, src_rank=second.src_rank),
            dataclasses.replace(second, src_rank=first.src_rank),
            *plan[2:],
        ]

    monkeypatch.setattr(sm, "tp_reshard_plan", swapped)
    claim = lp.tp_claim(2, 1, kv_grid=[8])
    assert claim.result == "violated"
    assert "content violated" in claim.detail


def test_shifted_cp_piece_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    good = sm.cp_reshard_plan

    def shifted(n: int, a: int, b: int) -> list[sm.TokenPiece]:
        plan = good(n, a, b)
        if len(plan) > 1:
            plan[1] = dataclasses.replace(plan[1], dst_start=plan[1].dst_start + 1)
        return plan

    monkeypatch.setattr(sm, "cp_reshard_plan", shifted)
    claim = lp.cp_claim(2, [1])
    assert claim.result == "violated"
    assert "T=" in claim.detail


def test_block_size_overlap_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    good = sm.block_size_plan

    def overlapping(n: int, a: int, b: int) -> list[sm.SlotPiece]:
        return [dataclasses.replace(p, dst_slot=max(0, p.dst_slot - 1)) for p in good(n, a, b)]

    monkeypatch.setattr(sm, "block_size_plan", overlapping)
    claim = lp.block_size_claim(8, 16)
    assert claim.result == "violated"
    assert "bs 8->16" in claim.detail and "violated" in claim.detail


def test_identity_permutation_breaks_axis_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sm, "layout_permutation", lambda src, dst: (0, 1, 2, 3, 4))
    claim = lp.axis_order_claim()
    assert claim.result == "violated"
    assert "permute-agrees violated" in claim.detail
