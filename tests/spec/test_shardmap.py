"""Shard maps of spec/shardmap.py against brute-force oracles, element by element."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec import shardmap as sm

TP_MAX = 8
KV_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)


def _valid(kv: int, tp: int) -> bool:
    return kv % tp == 0 or (kv < tp and tp % kv == 0)


TP_CASES = [
    (kv, a, b)
    for kv in KV_CHOICES
    for a in range(1, TP_MAX + 1)
    for b in range(1, TP_MAX + 1)
    if _valid(kv, a) and _valid(kv, b)
]


def test_every_tp_pair_up_to_8_is_covered() -> None:
    pairs = {(a, b) for _, a, b in TP_CASES}
    assert pairs == set(itertools.product(range(1, TP_MAX + 1), repeat=2))
    assert any(kv < max(a, b) for kv, a, b in TP_CASES)  # replicated heads are in the grid


@pytest.mark.parametrize("kv", KV_CHOICES)
@pytest.mark.parametrize("tp", range(1, 17))
def test_tp_ownership_is_consistent(kv: int, tp: int) -> None:
    if not _valid(kv, tp):
        with pytest.raises(ValueError, match=f"kv_heads={kv}"):
            sm.tp_heads(kv, tp, 0)
        return
    holders: Counter[int] = Counter()
    for rank in range(tp):
        heads = sm.tp_heads(kv, tp, rank)
        assert len(heads) == sm.tp_local_heads(kv, tp) >= 1
        for head in heads:
            holders[head] += 1
            assert rank in sm.tp_owner(kv, tp, head)
    assert holders == Counter({h: sm.tp_replicas(kv, tp) for h in range(kv)})
    for head in range(kv):
        owners = sm.tp_owner(kv, tp, head)
        assert [sm.tp_is_primary(kv, tp, r) for r in owners] == [True] + [False] * (len(owners) - 1)


@pytest.mark.parametrize(("kv", "src_tp", "dst_tp"), TP_CASES)
def test_tp_plan_writes_each_slot_once_with_its_own_head(kv: int, src_tp: int, dst_tp: int) -> None:
    plan = sm.tp_reshard_plan(kv, src_tp, dst_tp)
    written: Counter[tuple[int, int]] = Counter()
    primary_reads: Counter[tuple[int, int]] = Counter()
    for piece in plan:
        assert sm.tp_is_primary(kv, src_tp, piece.src_rank)  # only primaries are read
        assert piece.primary == sm.tp_is_primary(kv, dst_tp, piece.dst_rank)
        assert piece.src_stop - piece.src_start == piece.dst_stop - piece.dst_start > 0
        src_heads = sm.tp_heads(kv, src_tp, piece.src_rank)
        dst_heads = sm.tp_heads(kv, dst_tp, piece.dst_rank)
        for i in range(piece.dst_stop - piece.dst_start):
            s, d = piece.src_start + i, piece.dst_start + i
            assert src_heads[s] == dst_heads[d]  # the same global head arrives
            written[piece.dst_rank, d] += 1
            if piece.primary:
                primary_reads[piece.src_rank, s] += 1
    every_dst = {(r, j) for r in range(dst_tp) for j in range(sm.tp_local_heads(kv, dst_tp))}
    assert written == Counter(dict.fromkeys(every_dst, 1))
    every_src_primary = {
        (r, j)
        for r in range(src_tp)
        if sm.tp_is_primary(kv, src_tp, r)
        for j in range(sm.tp_local_heads(kv, src_tp))
    }
    assert primary_reads == Counter(dict.fromkeys(every_src_primary, 1))


def test_tp_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="tp=3 does not divide kv_heads=8"):
        sm.tp_reshard_plan(8, 3, 2)
    with pytest.raises(ValueError, match="kv_heads=3 does not divide tp=4"):
        sm.tp_heads(3, 4, 0)
    with pytest.raises(ValueError, match="rank=2"):
        sm.tp_heads(8, 2, 2)
    with pytest.raises(ValueError, match="q_heads=6"):
        sm.tp_q_heads(6, 2, 4, 0)


@pytest.mark.parametrize(("q", "kv", "tp"), [(8, 2, 1), (8, 2, 2), (8, 2, 4), (8, 2, 8), (8, 4, 2)])
def test_q_heads_use_local_kv_heads(q: int, kv: int, tp: int) -> None:
    seen = []
    for rank in range(tp):
        for qh in sm.tp_q_heads(q, kv, tp, rank):
            assert qh // (q // kv) in sm.tp_heads(kv, tp, rank)
            seen.append(qh)
    assert seen == list(range(q))


@pytest.mark.parametrize("cp", range(1, 5))
@pytest.mark.parametrize("num_tokens", [0, 1, 2, 3, 5, 7, 16, 17, 31])
def test_cp_shards_partition_tokens(cp: int, num_tokens: int) -> None:
    tokens: list[int] = []
    for rank in range(cp):
        start, end = sm.cp_tokens(num_tokens, cp, rank)
        assert start <= end
        assert all(sm.cp_owner(num_tokens, cp, t) == rank for t in range(start, end))
        tokens.extend(range(start, end))
    assert tokens == list(range(num_tokens))


@given(
    num_tokens=st.integers(0, 70),
    src_cp=st.integers(1, 4),
    dst_cp=st.integers(1, 4),
)
def test_cp_plan_moves_each_token_once_to_its_position(
    num_tokens: int, src_cp: int, dst_cp: int
) -> None:
    arrived: dict[int, int] = {}
    for p in sm.cp_reshard_plan(num_tokens, src_cp, dst_cp):
        assert p.length > 0
        s0, s1 = sm.cp_tokens(num_tokens, src_cp, p.src_rank)
        d0, d1 = sm.cp_tokens(num_tokens, dst_cp, p.dst_rank)
        assert p.src_start + p.length <= s1 - s0 and p.dst_start + p.length <= d1 - d0
        for i in range(p.length):
            dst_global = d0 + p.dst_start + i
            assert dst_global not in arrived
            arrived[dst_global] = s0 + p.src_start + i
    assert arrived == {t: t for t in range(num_tokens)}


def test_uneven_cp_last_shard() -> None:
    assert [sm.cp_tokens(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [sm.cp_tokens(5, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]


@settings(max_examples=200)
@given(
    src_start=st.integers(0, 40),
    dst_start=st.integers(0, 40),
    length=st.integers(0, 60),
    src_bs=st.integers(1, 20),
    dst_bs=st.integers(1, 20),
)
def test_token_copy_plan_preserves_positions(
    src_start: int, dst_start: int, length: int, src_bs: int, dst_bs: int
) -> None:
    pairs = []
    for p in sm.token_copy_plan(src_start, dst_start, length, src_bs, dst_bs):
        assert p.length > 0
        assert p.src_slot + p.length <= src_bs and p.dst_slot + p.length <= dst_bs
        for i in range(p.length):
            pairs.append(
                (
                    sm.token_at(p.src_block, p.src_slot + i, src_bs),
                    sm.token_at(p.dst_block, p.dst_slot + i, dst_bs),
                )
            )
    assert pairs == [(src_start + i, dst_start + i) for i in range(length)]


@pytest.mark.parametrize(("src_bs", "dst_bs"), [(16, 8), (8, 16), (16, 16), (4, 6), (5, 3)])
def test_block_size_plan_and_convert_slot_agree(src_bs: int, dst_bs: int) -> None:
    num_tokens = 50
    for p in sm.block_size_plan(num_tokens, src_bs, dst_bs):
        for i in range(p.length):
            got = sm.convert_slot(p.src_block, p.src_slot + i, src_bs, dst_bs)
            assert got == (p.dst_block, p.dst_slot + i)
    assert sm.convert_slot(1, 3, 16, 8) == (2, 3)
    assert sm.blocks_needed(num_tokens, src_bs) * src_bs >= num_tokens


@pytest.mark.parametrize("seed", range(5))
def test_flat_index_is_a_bijection_and_permutation_agrees(seed: int) -> None:
    rng = random.Random(seed)
    dims = sm.BlockDims(rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 5), rng.randint(1, 3))
    box = list(itertools.product(*(range(n) for n in (dims[0], 2, dims[1], dims[2], dims[3]))))
    assert len(box) == sm.block_numel(dims)
    for layout in sm.LAYOUTS:
        shape = sm.block_shape(layout, dims)
        offsets = sorted(sm.flat_index(layout, dims, idx) for idx in box)
        assert offsets == list(range(len(box)))
        other = next(x for x in sm.LAYOUTS if x != layout)
        perm = sm.layout_permutation(layout, other)
        assert tuple(shape[p] for p in perm) == sm.block_shape(other, dims)
        order = sm.axis_order(layout)
        for idx in rng.sample(box, min(20, len(box))):
            coords = dict(zip(sm.INDEX_AXES, idx, strict=True))
            in_src_order = [coords[a] for a in order]
            permuted = tuple(in_src_order[p] for p in perm)
            assert permuted == tuple(coords[a] for a in sm.axis_order(other))


def test_layout_names_and_shapes() -> None:
    dims = sm.BlockDims(layers=2, kv_heads=4, block_size=16, head_dim=8)
    assert sm.LAYOUTS == ("heads_major", "tokens_major")
    assert sm.block_shape("heads_major", dims) == (2, 2, 4, 16, 8)
    assert sm.block_shape("tokens_major", dims) == (2, 2, 16, 4, 8)
    # head 1, slot 0 and head 0, slot 1 swap places between the two layouts
    assert sm.flat_index("heads_major", dims, (0, 0, 1, 0, 0)) == 16 * 8
    assert sm.flat_index("tokens_major", dims, (0, 0, 1, 0, 0)) == 8
    with pytest.raises(ValueError, match="unknown layout 'nhd'"):
        sm.axis_order("nhd")
