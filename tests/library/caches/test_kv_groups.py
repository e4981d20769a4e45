"""Two KV cache groups of one request (a hybrid model: full-attention layers beside
sliding-window ones, each group its own geometry and block table) through
``handoff_groups``: both bit-exact, or neither committed (the receivers hold nothing, the
sources still hold the request); a sliding group that dropped its early blocks is refused
by name."""

from __future__ import annotations

import pytest
import torch

from refimpl.api import KVGeometry, ModelIdentity, Receiver, Sender, read_kv, write_kv
from refimpl.api.serve.groups import Group, group_request, handoff_groups
from refimpl.errors import ManifestError
from refimpl.rankpools import RankPools
from refimpl.transport import InProcessTransport
from spec.manifest import RopeConfig
from tests.library.lib_helpers import held

MODEL = ModelIdentity("hybrid", RopeConfig(10000.0, 8))
FULL = KVGeometry(2, 4, 8, 4, "float32", tp=2)  # full-attention layers, 4 KV heads
SLIDING = KVGeometry(1, 2, 8, 8, "float32")  # sliding-window layers: other heads and blocks
TOKENS = list(range(100, 123))  # 23 tokens: 6 full blocks, 3 sliding ones


def ends(
    t: InProcessTransport, g: KVGeometry, dst: KVGeometry, model: ModelIdentity = MODEL
) -> tuple[RankPools, RankPools, Sender, Receiver]:
    ps, pd = g.make_pools(8), dst.make_pools(8)
    return ps, pd, Sender(ps, g, t, MODEL), Receiver(pd, dst, t, model)


def fill(pools: RankPools, g: KVGeometry, holder: str, seed: int) -> torch.Tensor:
    blocks = pools.alloc.allocate(holder, g.blocks_for(len(TOKENS)))
    kv = torch.randn(
        (g.num_layers, 2, g.kv_heads, len(TOKENS), g.head_dim),
        generator=torch.Generator().manual_seed(seed),
    )
    write_kv(pools, holder, blocks, [list(layer) for layer in kv])
    return kv


def test_two_groups_hand_off_bit_exact_under_one_request() -> None:
    t = InProcessTransport()
    fs, fd, ftx, frx = ends(t, FULL, FULL.with_(tp=1))
    ss, sd, stx, srx = ends(t, SLIDING, SLIDING.with_(block_size=4))
    kv_full = fill(fs, FULL, group_request("r", "full"), 1)
    kv_sliding = fill(ss, SLIDING, group_request("r", "sliding"), 2)
    out = handoff_groups([Group("full", ftx, frx), Group("sliding", stx, srx)], "r", TOKENS)
    assert torch.equal(read_kv(fd, out["full"].received.blocks, len(TOKENS)), kv_full)
    assert torch.equal(read_kv(sd, out["sliding"].received.blocks, len(TOKENS)), kv_sliding)
    assert out["full"].received.manifest.num_layers == 2
    assert out["sliding"].received.manifest.num_layers == 1
    assert held(fs) == {} and held(ss) == {}  # both sources freed once both committed
    assert held(fd) == {"owned": 6} and held(sd) == {"owned": 6}


def test_a_failing_second_group_leaves_neither_committed_and_a_retry_succeeds() -> None:
    t = InProcessTransport()
    fs, fd, ftx, frx = ends(t, FULL, FULL.with_(tp=1))
    other = ModelIdentity("hybrid", RopeConfig(500000.0, 8))  # another RoPE base
    ss, sd, stx, srx = ends(t, SLIDING, SLIDING, model=other)
    kv_full = fill(fs, FULL, group_request("r", "full"), 1)
    kv_sliding = fill(ss, SLIDING, group_request("r", "sliding"), 2)
    groups = [Group("full", ftx, frx), Group("sliding", stx, srx)]
    with pytest.raises(ManifestError, match="rope.theta") as info:
        handoff_groups(groups, "r", TOKENS)
    assert any("kv cache group 'sliding'" in n for n in info.value.__notes__)
    assert held(fd) == {} and held(sd) == {}  # the full group's commit was given back
    assert held(fs) == {"owned": 6} and held(ss) == {"owned": 3}  # sources still held
    srx2 = Receiver(sd, SLIDING, t, MODEL)  # the decode side fixed: the same request again
    out = handoff_groups([groups[0], Group("sliding", stx, srx2)], "r", TOKENS)
    assert torch.equal(read_kv(fd, out["full"].received.blocks, len(TOKENS)), kv_full)
    assert torch.equal(read_kv(sd, out["sliding"].received.blocks, len(TOKENS)), kv_sliding)
    assert held(fs) == {} and held(ss) == {}


def test_a_sliding_group_without_its_early_blocks_is_refused_by_name() -> None:
    t = InProcessTransport()
    fs, fd, ftx, frx = ends(t, FULL, FULL)
    ss, sd, stx, srx = ends(t, SLIDING, SLIDING)
    fill(fs, FULL, group_request("r", "full"), 1)
    fill(ss, SLIDING, group_request("r", "sliding"), 2)
    window = ss.alloc.blocks_of(group_request("r", "sliding"))[1:]  # block 0 dropped
    groups = [Group("full", ftx, frx), Group("sliding", stx, srx, blocks=window)]
    with pytest.raises(ValueError, match="kv cache group 'sliding'.*sliding-window group"):
        handoff_groups(groups, "r", TOKENS)
    assert held(fd) == {} and held(sd) == {}  # nothing sent, for either group
    assert held(fs) == {"owned": 6} and held(ss) == {"owned": 3}


def test_groups_need_distinct_names() -> None:
    t = InProcessTransport()
    _, _, tx, rx = ends(t, SLIDING, SLIDING)
    with pytest.raises(ValueError, match="distinct names"):
        handoff_groups([Group("a", tx, rx), Group("a", tx, rx)], "r", TOKENS)
    with pytest.raises(ValueError, match="one or more"):
        handoff_groups([], "r", TOKENS)
