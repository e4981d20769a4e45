"""refimpl/reshard.py on real tensors: every rank ends with exactly its slice, torch.equal."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.reshard import (
    KVLayout,
    ShardedKV,
    allocate,
    read_tokens,
    reshard,
    shard,
    unshard,
    write_tokens,
)
from spec import shardmap as sm

LAYOUTS = ("heads_major", "tokens_major")


def _full(layers: int, heads: int, tokens: int, dim: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layers, 2, heads, tokens, dim, generator=g)  # (L, 2, H, T, D)


def _assert_holds_its_slice(kv: ShardedKV, full: torch.Tensor) -> None:
    """Oracle by hand: each (tp, cp) pool holds exactly full[:, :, its heads, its tokens]."""
    d = kv.decl
    for t in range(d.tp):
        heads = list(sm.tp_heads(d.kv_heads, d.tp, t))
        for c in range(d.cp):
            c0, c1 = sm.cp_tokens(kv.num_tokens, d.cp, c)
            pool, table = kv.pools[t][c], kv.block_tables[c]
            for i in range(c1 - c0):
                block, slot = table[i // d.block_size], i % d.block_size
                if d.layout == "heads_major":
                    got = pool[block, :, :, :, slot, :]  # (L, 2, h, D)
                else:
                    got = pool[block, :, :, slot, :, :]  # (L, 2, h, D)
                assert torch.equal(got, full[:, :, heads, c0 + i, :]), (t, c, i)


def _scramble(kv: ShardedKV, rng: random.Random) -> None:
    """Give every CP rank a non-contiguous, shuffled block table inside its pool."""
    for c, table in enumerate(kv.block_tables):
        capacity = kv.pools[0][c].shape[0]
        kv.block_tables[c] = rng.sample(range(capacity), len(table) - 2)


TP_PAIRS = [(2, 1), (1, 2), (4, 2), (2, 4), (8, 2), (1, 8), (8, 8), (3, 6)]


@pytest.mark.parametrize(("src_tp", "dst_tp"), TP_PAIRS)
@pytest.mark.parametrize("src_cp", [1, 3])
def test_every_target_rank_gets_exactly_its_slice(src_tp: int, dst_tp: int, src_cp: int) -> None:
    heads = 6 if 3 in (src_tp, dst_tp) else 4  # 4 heads: TP=8 replicates each head twice
    full = _full(2, heads, 29, 3, seed=src_tp * 10 + dst_tp)
    src = shard(full, KVLayout("heads_major", 2, heads, 8, 3, tp=src_tp, cp=src_cp))
    _assert_holds_its_slice(src, full)
    dst = allocate(KVLayout("tokens_major", 2, heads, 5, 3, tp=dst_tp), 29)
    stats = reshard(src, dst)
    _assert_holds_its_slice(dst, full)
    assert torch.equal(unshard(dst), full)
    assert stats.bytes_moved == full.numel() * 4 * max(1, dst_tp // heads)


@settings(max_examples=40, deadline=None)
@given(
    src_tp=st.sampled_from([1, 2, 4, 8]),
    dst_tp=st.sampled_from([1, 2, 4, 8]),
    heads=st.sampled_from([1, 2, 4, 8]),
    src_cp=st.integers(1, 4),
    tokens=st.integers(1, 40),
    src_bs=st.integers(1, 9),
    dst_bs=st.integers(1, 9),
    layouts=st.tuples(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS)),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_reshard_exactly(
    src_tp: int,
    dst_tp: int,
    heads: int,
    src_cp: int,
    tokens: int,
    src_bs: int,
    dst_bs: int,
    layouts: tuple[str, str],
    seed: int,
) -> None:
    full = _full(2, heads, tokens, 2, seed)
    src = shard(full, KVLayout(layouts[0], 2, heads, src_bs, 2, tp=src_tp, cp=src_cp), 3)
    _scramble(src, random.Random(seed))
    reshard(shard(full, KVLayout("heads_major", 2, heads, 4, 2)), src)  # refill scrambled src
    _assert_holds_its_slice(src, full)
    dst = allocate(KVLayout(layouts[1], 2, heads, dst_bs, 2, tp=dst_tp), tokens, spare_blocks=4)
    _scramble(dst, random.Random(seed + 1))
    reshard(src, dst)
    _assert_holds_its_slice(dst, full)


def test_suffix_only_leaves_the_prefix_alone() -> None:
    full = _full(2, 4, 30, 4)
    src = shard(full, KVLayout("heads_major", 2, 4, 8, 4, tp=2))
    dst = allocate(KVLayout("heads_major", 2, 4, 4, 4, tp=1), 30)
    for row in dst.pools:
        row[0].fill_(-1.0)
    reshard(src, dst, start=13)
    got = unshard(dst)
    assert torch.equal(got[:, :, :, 13:], full[:, :, :, 13:])
    assert bool((got[:, :, :, :13] == -1.0).all())


def test_write_then_read_tokens_per_layer() -> None:
    full = _full(2, 4, 21, 4, seed=3)
    kv = allocate(KVLayout("tokens_major", 2, 4, 4, 4, tp=8), 21)
    for layer in range(2):
        write_tokens(kv, layer, 0, full[layer, 0, :, :15], full[layer, 1, :, :15])
        write_tokens(kv, layer, 15, full[layer, 0, :, 15:], full[layer, 1, :, 15:])
    _assert_holds_its_slice(kv, full)
    for rank in range(8):
        k, v = read_tokens(kv, rank, 1)
        head = sm.tp_heads(4, 8, rank).start
        assert k.is_contiguous() and torch.equal(k, full[1, 0, head : head + 1])
        assert torch.equal(v, full[1, 1, head : head + 1])


def test_declared_layout_mismatch_is_refused() -> None:
    """Incident 3: a tokens_major buffer declared as heads_major must not be sliced."""
    decl = KVLayout("heads_major", 2, 8, 16, 4, tp=2)
    kv = allocate(decl, 32)
    kv.num_tokens = 32
    actual = KVLayout("tokens_major", 2, 8, 16, 4, tp=2)
    kv.pools[1][0] = torch.zeros(actual.pool_shape(2))  # (2, 2, 2, 16, 4, 4)
    dst = allocate(KVLayout("heads_major", 2, 8, 16, 4, tp=1), 32)
    with pytest.raises(ValueError, match=r"pool\[tp=1\]\[cp=0\].*matches 'tokens_major'"):
        reshard(kv, dst)


def test_permuted_view_cannot_pose_as_the_other_layout() -> None:
    # kv_heads_local == block_size: shape alone cannot tell; a permuted view is refused
    decl = KVLayout("heads_major", 1, 4, 4, 2, tp=1)
    kv = allocate(decl, 4)
    kv.num_tokens = 4
    kv.pools[0][0] = kv.pools[0][0].transpose(3, 4)
    with pytest.raises(ValueError, match="not contiguous"):
        reshard(kv, allocate(decl, 4))


def test_equal_shapes_trust_the_declared_layout() -> None:
    # kv_heads_local == block_size == 4: both layouts have one shape; the declaration decides
    full = _full(1, 4, 8, 2, seed=5)
    for layout in LAYOUTS:
        src = shard(full, KVLayout(layout, 1, 4, 4, 2))
        other = next(x for x in LAYOUTS if x != layout)
        dst = allocate(KVLayout(other, 1, 4, 4, 2, tp=2), 8)
        reshard(src, dst)
        _assert_holds_its_slice(dst, full)


def test_other_mismatches_name_the_field() -> None:
    src = shard(_full(2, 4, 8, 4), KVLayout("heads_major", 2, 4, 4, 4, tp=2))
    with pytest.raises(ValueError, match="kv_heads 4 != 8"):
        reshard(src, allocate(KVLayout("heads_major", 2, 8, 4, 4), 8))
    with pytest.raises(ValueError, match="dtype"):
        reshard(src, allocate(KVLayout("heads_major", 2, 4, 4, 4), 8, dtype=torch.float64))
    short = allocate(KVLayout("heads_major", 2, 4, 4, 4), 4)
    with pytest.raises(ValueError, match="block table of cp rank 0 has 1 blocks, needs 2"):
        reshard(src, short)
    src.pools.pop()
    with pytest.raises(ValueError, match="declared tp=2"):
        reshard(src, allocate(KVLayout("heads_major", 2, 4, 4, 4), 8))
    with pytest.raises(ValueError, match="tp=3 does not divide kv_heads=4"):
        KVLayout("heads_major", 2, 4, 4, 4, tp=3)
    with pytest.raises(ValueError, match="unknown layout"):
        KVLayout("nhd", 2, 4, 4, 4)


def test_manifest_round_trip() -> None:
    decl = KVLayout("tokens_major", 2, 4, 16, 8, tp=2, cp=2)
    assert KVLayout.from_manifest(decl.to_manifest()) == decl


def test_allocate_sizes_each_table_for_its_tokens_and_the_spares() -> None:
    decl = KVLayout("heads_major", 2, 4, 4, 3, cp=3)
    for spare in (0, 2):
        kv = allocate(decl, 23) if spare == 0 else allocate(decl, 23, spare_blocks=spare)
        # 23 tokens over 3 CP ranks: 8, 8, 7 tokens; ceil(n / 4) blocks each
        assert [len(t) for t in kv.block_tables] == [2 + spare, 2 + spare, 2 + spare]
        assert all(p.shape[0] == 2 + spare for row in kv.pools for p in row)
        assert kv.num_tokens == 0 and all(bool((p == 0).all()) for row in kv.pools for p in row)
    assert [len(t) for t in allocate(decl, 0).block_tables] == [0, 0, 0]


@pytest.mark.parametrize(("src_tp", "dst_tp", "dst_bs"), [(2, 1, 5), (1, 4, 3), (4, 4, 8)])
def test_stats_count_what_lands_on_the_destination(src_tp: int, dst_tp: int, dst_bs: int) -> None:
    """bytes_moved is the seed's payload M_KV = 2 L T H D s (each head lands once) and
    blocks_written every destination block the tokens occupy, on every TP rank."""
    layers, heads, tokens, dim = 2, 4, 21, 3
    full = _full(layers, heads, tokens, dim, seed=dst_bs)
    src = shard(full, KVLayout("tokens_major", layers, heads, 4, dim, tp=src_tp))
    dst = allocate(KVLayout("heads_major", layers, heads, dst_bs, dim, tp=dst_tp), tokens)
    stats = reshard(src, dst)
    assert stats.bytes_moved == 2 * layers * tokens * heads * dim * 4
    assert stats.blocks_written == dst_tp * -(-tokens // dst_bs)
    assert stats.copies >= stats.blocks_written // dst_tp
    again = reshard(src, dst, start=tokens - 1)  # one token: one block per rank
    assert again.bytes_moved == 2 * layers * heads * dim * 4 and again.blocks_written == dst_tp


def test_a_refused_reshard_leaves_the_destination_as_it_was() -> None:
    full = _full(2, 4, 8, 4)
    good = KVLayout("heads_major", 2, 4, 4, 4, tp=2)
    broken: list[ShardedKV] = []
    for damage in ("pool shape", "short table", "pool missing", "dtype"):
        src = shard(full, good)
        if damage == "pool shape":
            src.pools[1][0] = torch.zeros(2, 2, 2, 2, 5, 4)  # block_size 5, not 4
        elif damage == "short table":
            src.block_tables[0] = src.block_tables[0][:1]
        elif damage == "pool missing":
            src.pools.pop()
        else:
            src.pools = [[p.double() for p in row] for row in src.pools]
        broken.append(src)
    for src in broken:
        dst = allocate(KVLayout("tokens_major", 2, 4, 4, 4), 8)
        dst.pools[0][0].fill_(7.0)
        with pytest.raises(ValueError):
            reshard(src, dst)
        assert dst.num_tokens == 0 and bool((dst.pools[0][0] == 7.0).all())
    short = allocate(KVLayout("tokens_major", 2, 4, 4, 4), 4)  # room for 4 tokens, not 8
    with pytest.raises(ValueError, match="needs 2"):
        reshard(shard(full, good), short)
    assert short.num_tokens == 0


def test_whole_adjacent_blocks_merge_into_one_span_and_a_gap_splits_it() -> None:
    """Equal block sizes and adjacent ascending ids on both sides: each whole block joins
    the span before it, so one copy moves all three (issue #33: a merge written over the
    span before the last one survived the fuzz); a gap on one side starts a new span."""
    full = _full(2, 2, 12, 4)
    src = shard(full, KVLayout("heads_major", 2, 2, 4, 4))
    for table, copies in (([1, 2, 3], 1), ([1, 2, 0], 2)):
        dst = allocate(KVLayout("tokens_major", 2, 2, 4, 4), 12, spare_blocks=1)
        dst.block_tables = [table]
        stats = reshard(src, dst)
        assert (stats.copies, stats.blocks_written) == (copies, 3), table
        _assert_holds_its_slice(dst, full)
