"""A ``DiskTier`` between an engine's own registered caches and the files (issue #31 item
4): the offload reads the engine's blocks (the scheduler's ids, adopted), the reload
writes the hit into the blocks the engine gives (``blocks=``), in every vLLM layout, per
layer and cross-layer. Bytes are read back from the engine's tensors by plain indexing
(``reg_helpers``); every block outside the given ids is compared with its bytes before:
0 written there, on a hit and on a damaged file (a miss: nothing committed, the given
blocks the engine's again). Where the geometries agree (tp=1, HND, the file's block size,
contiguous pieces) no staging buffer is taken at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reg_helpers import KINDS, MODEL, Kind, changed, fill, make, snapshot, tokens_of

from refimpl.api import DiskTier, offload, reload
from refimpl.api.offload import reload_async
from refimpl.blocks import BlockStatus
from refimpl.errors import InUseError, MissError
from refimpl.memory import register_kv_caches
from refimpl.tiers import kvio

TOKENS = list(range(100, 112))  # 12 tokens: 3 blocks of 4; chunks of 8 -> [0,8) [8,12)
SRC, DST = [9, 2, 5], [0, 11, 6]  # engine-chosen ids, neither sorted nor contiguous
BY_NAME = {str(k): k for k in KINDS}


def _stored(kind: Kind, d: Path, tokens: list[int] = TOKENS):  # type: ignore[no-untyped-def]
    caches, geo = make(kind), kind.geometry()
    pools = register_kv_caches(geo, caches, kind.name, cross_layer=kind.cross)
    fill(kind, caches, SRC, seed=len(tokens))
    pools.adopt("r1", SRC)
    tier = DiskTier(d, MODEL, chunk_tokens=8)
    st = offload(pools, geo, tier, None, "r1", tokens)
    return caches, geo, pools, tier, st


def _no_staging(monkeypatch: pytest.MonkeyPatch, tier: DiskTier) -> list[object]:
    taken: list[object] = []
    real = tier.staging.take
    monkeypatch.setattr(tier.staging, "take", lambda *a: taken.append(a) or real(*a))
    return taken


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_offload_and_reload_in_the_engines_blocks_bit_exact(
    kind: Kind, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    caches, geo, pools, tier, st = _stored(kind, tmp_path)
    assert len(st.keys) == 2 and pools.freeable("r1") == tuple(SRC)  # the offload's pin dropped
    want = tokens_of(kind, caches, SRC, len(TOKENS))
    before = snapshot(kind, caches)
    taken = _no_staging(monkeypatch, tier)
    back = reload(tier, None, pools, geo, "r2", TOKENS, blocks=DST, free_host=False)
    assert back.blocks == tuple(DST) and back.num_tokens == 12 and back.checks == 3
    assert torch.equal(tokens_of(kind, caches, DST, 12), want)
    assert changed(kind, caches, before) == sorted(DST)  # 0 bytes outside the given blocks
    assert all(pools.alloc.status(b) is BlockStatus.OWNED for b in DST)
    assert pools.freeable("r2") == tuple(DST) and pools.release("r2") == tuple(DST)
    agree = kind.kv_layout == "heads_major" and not kind.cross and "packed" not in kind.name
    assert kvio.direct(pools, 4) == agree
    assert (taken == []) == agree  # in place where the geometries agree, else one staging


def test_a_longer_prompt_hits_its_stored_prefix_in_the_engines_blocks(tmp_path: Path) -> None:
    kind = BY_NAME["flashinfer_hnd"]
    caches, geo, pools, tier, _ = _stored(kind, tmp_path)
    want = tokens_of(kind, caches, SRC, 8)
    longer = TOKENS[:8] + [7] * 9  # the first chunk is shared; its second is another
    assert tier.lookup(geo, longer) == 8
    back = reload(tier, None, pools, geo, "r2", longer, blocks=[0, 11, 6, 1, 3])
    assert back.num_tokens == 8 and back.blocks == (0, 11, 6, 1, 3)
    assert torch.equal(tokens_of(kind, caches, [0, 11], 8), want)
    assert pools.alloc.blocks_of("r2") == (0, 11, 6, 1, 3)  # the engine computes the rest


def test_another_layout_and_block_size_reload_the_same_tokens(tmp_path: Path) -> None:
    src = BY_NAME["flash_attn"]  # NHD per layer, blocks of 4
    caches, _, _, tier, _ = _stored(src, tmp_path)
    want = tokens_of(src, caches, SRC, 12)
    dst = BY_NAME["flashinfer_hnd-cross"]
    dc, gd = make(dst, 6, 8), dst.geometry(8)
    pd = register_kv_caches(gd, dc, dst.name, cross_layer=True)
    before = snapshot(dst, dc, 6)
    back = reload(tier, None, pd, gd, "r2", TOKENS, blocks=[4, 1])
    assert back.num_tokens == 12
    assert torch.equal(tokens_of(dst, dc, [4, 1], 12), want)
    assert changed(dst, dc, before) == [1, 4]


@pytest.mark.parametrize("name", ["flashinfer_hnd", "flash_attn_hnd", "flash_attn"])
def test_a_damaged_file_is_a_miss_with_nothing_written_outside_the_given_blocks(
    name: str, tmp_path: Path
) -> None:
    kind = BY_NAME[name]
    caches, geo, pools, tier, st = _stored(kind, tmp_path)
    data = bytearray(st.paths[1].read_bytes())
    data[-3] ^= 0xFF  # the second chunk's last block
    st.paths[1].write_bytes(bytes(data))
    before = snapshot(kind, caches)
    with pytest.raises(MissError, match="TornFileError"):
        reload(tier, None, pools, geo, "r2", TOKENS, blocks=DST)
    assert set(changed(kind, caches, before)) <= set(DST)  # 0 bytes outside them
    assert pools.alloc.blocks_of("r2") == ()  # nothing committed: no block is the request's
    assert all(pools.alloc.status(b) is BlockStatus.FREE for b in DST)
    assert pools.freeable("r2") == tuple(DST) and pools.release("r2") == tuple(DST)
    assert pools.freeable("r1") == tuple(SRC)  # the source is untouched
    assert not st.paths[1].exists() and st.paths[0].exists()  # the bad chunk unpublished
    assert tier.lookup(geo, TOKENS) == 8  # the next lookup stops before it
    pools.alloc.check_integrity()


def test_a_damaged_first_chunk_staged_writes_no_byte(tmp_path: Path) -> None:
    kind = BY_NAME["flash_attn"]  # NHD: read into staging, verified, then installed
    caches, geo, pools, tier, st = _stored(kind, tmp_path)
    data = bytearray(st.paths[0].read_bytes())
    data[-3] ^= 0xFF
    st.paths[0].write_bytes(bytes(data))
    before = snapshot(kind, caches)
    with pytest.raises(MissError):
        reload(tier, None, pools, geo, "r2", TOKENS, blocks=DST)
    assert changed(kind, caches, before) == []
    assert pools.release("r2") == tuple(DST)


def test_the_engines_blocks_bound_the_hit_and_are_held_until_settled(tmp_path: Path) -> None:
    kind = BY_NAME["flashinfer_hnd"]
    caches, geo, pools, tier, st = _stored(kind, tmp_path)
    back = reload(tier, None, pools, geo, "r2", TOKENS, blocks=[0, 11], free_host=False)
    assert back.num_tokens == 8 and back.chunks == 1  # 2 blocks hold the first chunk only
    assert [tier.pinned(k) for k in st.keys] == [0, 0]
    with pytest.raises(MissError, match="less than the first stored chunk"):
        reload(tier, None, pools, geo, "r3", TOKENS, blocks=[1])
    assert pools.alloc.blocks_of("r3") == () and [tier.pinned(k) for k in st.keys] == [0, 0]
    with pytest.raises(ValueError, match="decode_room"):
        reload(tier, None, pools, geo, "r3", TOKENS, blocks=[1, 3], decode_room=4)
    with pytest.raises(ValueError, match=r"\[99\] not block ids"):
        reload(tier, None, pools, geo, "r3", TOKENS, blocks=[1, 99])
    assert pools.alloc.blocks_of("r3") == ()
    t = reload_async(tier, pools, geo, "r4", TOKENS, blocks=[1, 3, 4])
    with pytest.raises(InUseError):
        pools.release("r4")  # reserved for the transfer: the engine cannot free them yet
    assert t.wait().blocks == (1, 3, 4) and pools.release("r4") == (1, 3, 4)
