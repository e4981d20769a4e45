"""``HostTier`` (issue #31 item 4): the host's prefix cache on the disk tier's chunk keys.
A longer prompt hits the chunks a shorter one stored, on host as on disk; a shared prefix
is not copied twice; another geometry or engine's registered memory reloads the same
tokens bit-exact; a damaged host chunk is a miss with nothing committed and no byte
outside the given blocks; the least recently used chunks make room, never the request's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from refimpl.api import DiskTier, HostTier, KVGeometry, offload, reload
from refimpl.blocks import BlockStatus
from refimpl.errors import MissError
from refimpl.memory import register_kv_caches
from tests.library.registered import reg_helpers as rh
from tests.library.test_disk_prefix import CANON, _device
from tests.library.test_disk_tier import DEV, MODEL, _per_token

A = list(range(1000, 1040))  # 40 tokens: chunks of 16 -> [0,16) [16,32) [32,40)
B = A[:32] + list(range(5000, 5020))  # shares A's first two chunks


def _host(geo: KVGeometry = DEV, tokens: list[int] = A, cap: int = 1 << 20):  # type: ignore[no-untyped-def]
    dev, blocks = _device(geo, tokens)
    host = HostTier(MODEL, cap, chunk_tokens=16)
    kept = offload(dev, geo, host, None, "r1", tokens)
    return host, kept, dev, _per_token(dev, blocks, len(tokens))


def test_a_longer_prompt_hits_its_stored_prefix_on_host() -> None:
    host, kept, dev, want = _host()
    assert len(kept.keys) == 3 and kept.added == 3 and kept.num_tokens == 40
    assert host.lookup(DEV, A) == 40 and host.lookup(DEV, A + [7] * 30) == 32
    assert host.lookup(DEV, [5] + A[1:]) == 0  # one token changed: every key changes
    longer = A + [7] * 30
    back = reload(host, None, dev, DEV, "r2", longer, free_host=False)
    assert back.num_tokens == 32 and back.chunks == 2 and back.checks == 8
    assert len(back.blocks) == DEV.blocks_for(70)  # the prompt's blocks, the rest computed
    assert all(dev.alloc.status(b) is BlockStatus.OWNED for b in back.blocks)
    assert torch.equal(_per_token(dev, list(back.blocks), 32), want[:32])
    assert host.lookup(DEV, A) == 40  # free_host=False: still held


def test_the_host_and_disk_tiers_share_one_key_scheme(tmp_path: Path) -> None:
    host, kept, dev, _ = _host()
    disk = DiskTier(tmp_path, MODEL, chunk_tokens=16)
    st = offload(dev, DEV, disk, None, "r1", A)
    assert kept.keys == st.keys and host.keys() == disk.keys()
    assert host.chunk_keys(DEV, B)[:2] == list(kept.keys[:2])


def test_a_shared_prefix_is_held_once() -> None:
    host, kept, _, _ = _host()
    dev, _ = _device(DEV, B, "rb")
    again = offload(dev, DEV, host, None, "rb", B)
    assert again.keys[:2] == kept.keys[:2] and again.added == 2  # [32,48) and [48,52)
    assert again.nbytes == 5 * DEV.canonical_block_bytes  # 4 + 1 blocks, not 13
    assert len(host.keys()) == 5 and host.lookup(DEV, B) == 52


def test_another_geometry_reloads_the_same_tokens() -> None:
    host, _, _, want = _host(DEV)  # tp=2 tokens_major, blocks of 4
    dst_geo = CANON.with_(block_size=8)  # tp=1 heads_major, blocks of 8
    dst = dst_geo.make_pools(16)
    back = reload(host, None, dst, dst_geo, "r2", A)
    assert back.num_tokens == 40 and host.keys() == []  # free_host: dropped once committed
    assert torch.equal(_per_token(dst, list(back.blocks), 40), want)


@pytest.mark.parametrize("name", ["flashinfer_hnd", "flash_attn"])
def test_registered_memory_round_trips_through_the_host_in_the_engines_blocks(
    name: str,
) -> None:
    kind = next(k for k in rh.KINDS if str(k) == name)
    caches, geo = rh.make(kind), kind.geometry()
    pools = register_kv_caches(geo, caches, kind.name, cross_layer=kind.cross)
    rh.fill(kind, caches, [9, 2, 5], seed=3)
    pools.adopt("r1", [9, 2, 5])
    tokens = list(range(100, 112))
    host = HostTier(rh.MODEL, 1 << 20, chunk_tokens=8)
    assert offload(pools, geo, host, None, "r1", tokens).keys == tuple(host.chunk_keys(geo, tokens))
    assert pools.freeable("r1") == (9, 2, 5)
    want, before = rh.tokens_of(kind, caches, [9, 2, 5], 12), rh.snapshot(kind, caches)
    back = reload(host, None, pools, geo, "r2", tokens, blocks=[0, 11, 6])
    assert back.blocks == (0, 11, 6) and back.num_tokens == 12
    assert torch.equal(rh.tokens_of(kind, caches, [0, 11, 6], 12), want)
    assert rh.changed(kind, caches, before) == [0, 6, 11]
    assert pools.release("r2") == (0, 11, 6)


def test_a_damaged_host_chunk_is_a_miss_with_nothing_committed() -> None:
    kind = next(k for k in rh.KINDS if str(k) == "flashinfer_hnd")
    caches, geo = rh.make(kind), kind.geometry()
    pools = register_kv_caches(geo, caches, kind.name)
    rh.fill(kind, caches, [1, 2, 3], seed=4)
    pools.adopt("r1", [1, 2, 3])
    tokens = list(range(12))
    host = HostTier(rh.MODEL, 1 << 20, chunk_tokens=8)
    kept = offload(pools, geo, host, None, "r1", tokens)
    bad = host.prefix(geo, tokens)[1]
    bad.data.view(-1)[-1] += 1  # a flipped value in the second chunk's last block
    before = rh.snapshot(kind, caches)
    with pytest.raises(MissError, match="TornFileError"):
        reload(host, None, pools, geo, "r2", tokens, blocks=[4, 7, 8])
    assert set(rh.changed(kind, caches, before)) <= {4, 7, 8}  # 0 bytes outside them
    assert pools.alloc.blocks_of("r2") == () and pools.release("r2") == (4, 7, 8)
    assert host.keys() == sorted(kept.keys[:1]) and host.lookup(geo, tokens) == 8
    pools.alloc.check_integrity()


def test_a_miss_reserves_nothing_and_room_drops_the_least_recent_chunks() -> None:
    dev, _ = _device(DEV, A)
    with pytest.raises(MissError):
        reload(HostTier(MODEL, 1 << 20, chunk_tokens=16), None, dev, DEV, "r2", A)
    assert dev.alloc.blocks_of("r2") == ()
    blk = DEV.canonical_block_bytes
    host = HostTier(MODEL, 14 * blk, chunk_tokens=16)
    offload(dev, DEV, host, None, "r1", A)  # 4 + 4 + 2 blocks
    dev2, _ = _device(DEV, B, "rb")
    later = offload(dev2, DEV, host, None, "rb", B)  # shares 2 chunks, adds 4 + 1 blocks
    assert later.num_tokens == 52 and host.lookup(DEV, B) == 52
    assert host.keys() == sorted([*later.keys])  # A's tail went (the least recent)
    assert host.nbytes == 13 * blk and host.lookup(DEV, A) == 32
    chunk = 4 * blk
    small = HostTier(MODEL, chunk + 1, chunk_tokens=16)
    part = offload(dev, DEV, small, None, "r1", A, free_device=True)
    assert part.num_tokens == 16 and len(part.keys) == 1  # the run kept: what fits
    assert dev.alloc.blocks_of("r1") != ()  # not all held: the device keeps its blocks
