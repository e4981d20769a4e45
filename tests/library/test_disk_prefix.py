"""The disk tier's chunked prefix keys and asynchronous transfers (issue #31, tiers): a
lookup hits the longest stored prefix, a longer prompt hits a shorter one's chunks,
another geometry or chunking misses, a damaged chunk is a miss with nothing allocated
(a bad header shortens the run), a reader pins what it reads, and a cancelled transfer
leaves nothing half-installed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from refimpl.api import DiskTier, KVGeometry, disk, offload, reload
from refimpl.api.disk import Loaded, Miss
from refimpl.api.offload import offload_async, reload_async
from refimpl.blocks import BlockStatus
from refimpl.errors import FrozenError, InUseError, MissError
from refimpl.tiers import kvio, moves
from refimpl.tiers.transfer import Cancelled
from tests.library.test_disk_tier import DEV, MODEL, _per_token

CANON = KVGeometry(2, 4, 8, 4, "bfloat16")  # tp=1 heads_major: direct reads and writes
A = list(range(1000, 1040))  # 40 tokens: chunks of 16 -> [0,16) [16,32) [32,40)


def _device(geo: KVGeometry, tokens: list[int], rid: str = "r1", cap: int = 32) -> Any:
    pools = geo.make_pools(max(cap, geo.blocks_for(len(tokens))))
    blocks = pools.alloc.allocate(rid, geo.blocks_for(len(tokens)), epoch=0)
    g = torch.Generator().manual_seed(len(tokens))
    for p in pools.pools:
        p.kv[blocks] = torch.randn(p.kv[blocks].shape, generator=g).to(p.kv.dtype)
    return pools, blocks


def _stored(d: Path, geo: KVGeometry = DEV, tokens: list[int] = A, chunk: int = 16) -> Any:
    dev, blocks = _device(geo, tokens)
    tier = DiskTier(d, MODEL, chunk_tokens=chunk)
    st = offload(dev, geo, tier, None, "r1", tokens)
    return tier, st, _per_token(dev, blocks, len(tokens))


def test_a_store_is_one_file_per_chunk_and_the_lookup_hits_the_longest_prefix(
    tmp_path: Path,
) -> None:
    tier, st, _ = _stored(tmp_path)
    assert len(st.keys) == 3 and sorted(st.keys) == tier.keys()
    assert [m.num_tokens for m in st.manifests] == [16, 16, 8]
    assert [m.start_pos for m in st.manifests] == [0, 16, 32]
    assert tier.lookup(DEV, A) == 40  # the same prompt: every chunk, the partial one too
    assert tier.lookup(DEV, A[:32] + [7] * 30) == 32  # the full chunks it starts with
    assert tier.lookup(DEV, A + [7] * 30) == 32  # longer: its third chunk is not the tail
    assert tier.lookup(DEV, A[:20]) == 16
    assert tier.lookup(DEV, [5] + A[1:]) == 0  # one token changed: every key changes
    assert tier.lookup(DEV, A[:15]) == 0


def test_a_longer_prompt_reloads_the_stored_prefix_bit_exact(tmp_path: Path) -> None:
    tier, _, want = _stored(tmp_path)
    longer = A[:32] + list(range(50))  # 82 tokens, 32 of them stored
    dst = CANON.make_pools(32)  # another layout and TP: reshaped on the way in
    back = reload(tier, None, dst, CANON, "r2", longer, decode_room=6, free_host=False)
    assert back.num_tokens == 32 and back.chunks == 2 and back.checks == 8
    assert len(back.blocks) == CANON.blocks_for(82 + 6) == 22  # the prompt and the room
    assert dst.alloc.blocks_of("r2") == back.blocks
    got = _per_token(dst, list(back.blocks[:8]), 32)
    assert torch.equal(got, want[:32])
    assert len(tier.keys()) == 3  # free_host=False: still published


def test_the_default_chunk_of_256_tokens_serves_a_longer_prompt(tmp_path: Path) -> None:
    tokens = list(range(300))
    tier, st, want = _stored(tmp_path, CANON, tokens, chunk=256)
    assert [m.num_tokens for m in st.manifests] == [256, 44]
    dst = CANON.make_pools(128)
    back = reload(tier, None, dst, CANON, "r2", tokens + [1] * 100)  # direct reads
    assert back.num_tokens == 256
    assert torch.equal(_per_token(dst, list(back.blocks[:64]), 256), want[:256])
    assert tier.keys() == [st.keys[1]]  # free_host: the chunk read is unpublished


@pytest.mark.parametrize(
    "other",
    [
        DEV.with_(dtype="float32"),
        DEV.with_(kv_heads=2, tp=1),
        DEV.with_(head_dim=4),
        DEV.with_(num_layers=1),
        DEV.with_(cache_fields=("k",)),
    ],
    ids=["dtype", "heads", "head_dim", "layers", "fields"],
)
def test_another_geometry_misses_and_allocates_nothing(tmp_path: Path, other: KVGeometry) -> None:
    tier, _, _ = _stored(tmp_path)
    assert tier.lookup(other, A) == 0
    dst = other.make_pools(16)
    with pytest.raises(MissError, match="not published"):
        reload(tier, None, dst, other, "r2", A)
    assert dst.alloc.num_free == 16


def test_another_chunking_or_model_misses(tmp_path: Path) -> None:
    _stored(tmp_path)
    assert DiskTier(tmp_path, MODEL, chunk_tokens=32).lookup(DEV, A) == 0
    assert DiskTier(tmp_path, MODEL, chunk_tokens=16).lookup(DEV, A) == 40
    with pytest.raises(ValueError, match="chunk_tokens"):
        DiskTier(tmp_path, MODEL, chunk_tokens=0)
    tier = DiskTier(tmp_path, MODEL, chunk_tokens=6)  # no multiple of the block size 4
    dev, _ = _device(DEV, A)
    with pytest.raises(ValueError, match="does not divide"):
        offload(dev, DEV, tier, None, "r1", A)


def _flip_last_data_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[-3] ^= 0xFF
    p.write_bytes(bytes(data))


def test_a_damaged_chunk_is_a_miss_with_nothing_allocated(tmp_path: Path) -> None:
    tier, st, _ = _stored(tmp_path)
    _flip_last_data_byte(st.paths[1])  # the second chunk's last block
    dst = CANON.make_pools(32)
    with pytest.raises(MissError, match="block 3: bytes hash to"):
        reload(tier, None, dst, CANON, "r2", A)
    assert dst.alloc.num_free == 32 and dst.alloc.holders() == ()
    dst.alloc.check_integrity()
    assert tier.keys() == sorted([st.keys[0], st.keys[2]])  # the bad chunk unpublished
    assert tier.lookup(DEV, A) == 16  # the next lookup stops before it: no second failure
    _flip_last_data_byte(st.paths[0])
    got = tier.load(DEV, A, "r3")
    assert isinstance(got, Miss) and "block 3" in got.reason and tier.lookup(DEV, A) == 0


def test_a_torn_header_ends_the_run_before_it(tmp_path: Path) -> None:
    tier, st, want = _stored(tmp_path)
    st.paths[1].write_bytes(st.paths[1].read_bytes()[:100])  # torn: the header cut
    assert tier.lookup(DEV, A) == 16
    dst = CANON.make_pools(32)
    back = reload(tier, None, dst, CANON, "r2", A, free_host=False)
    assert back.num_tokens == 16
    assert torch.equal(_per_token(dst, list(back.blocks[:4]), 16), want[:16])
    st.paths[0].write_bytes(b"")  # the first chunk torn: a miss, nothing reserved
    with pytest.raises(MissError, match="TornFileError"):
        reload(tier, None, dst, CANON, "r3", A)
    assert dst.alloc.blocks_of("r3") == ()


def test_a_chunk_after_another_prefix_is_refused_by_its_parent(tmp_path: Path) -> None:
    tier, st, _ = _stored(tmp_path)
    other = [9] * 16 + A[16:40]  # A's second and third chunks' tokens after another first
    dev, _ = _device(DEV, other)
    ost = offload(dev, DEV, tier, None, "r1", other)
    assert ost.keys[0] != st.keys[0] and ost.keys[1] != st.keys[1]  # the chain differs
    st.paths[1].replace(ost.paths[1])  # A's chunk 1 (right tokens, right place) under it
    got = tier.open_prefix(DEV, other)
    assert not isinstance(got, Miss)
    with got:
        assert got.num_tokens == 16 and "parent: the file follows" in got.stopped


def _gate(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> tuple[Any, Any]:
    """Make ``module.name`` wait for ``go`` on its first call, after setting ``started``."""
    started, go, real = threading.Event(), threading.Event(), getattr(module, name)
    calls = [0]

    def gated(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            started.set()
            assert go.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(module, name, gated)
    return started, go


def test_an_async_reload_owns_its_blocks_until_settled_and_cancels_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, st, _ = _stored(tmp_path, CANON)
    dst = CANON.make_pools(32)
    started, go = _gate(monkeypatch, kvio, "read_into")
    t = reload_async(tier, dst, CANON, "r2", A)
    assert started.wait(10)
    held = dst.alloc.blocks_of("r2")
    assert len(held) == 10 and all(dst.alloc.status(b) is BlockStatus.RESERVED for b in held)
    with pytest.raises(InUseError):
        dst.alloc.free("r2")  # the transfer's destination: nobody frees it under I/O
    assert [tier.pinned(k) for k in st.keys] == [1, 1, 1]  # the hit pins what it reads
    assert tier.remove(st.keys[0]) and st.paths[0].exists()  # deferred while pinned
    assert not t.poll()
    threading.Timer(0.05, go.set).start()
    assert t.cancel() and t.cancelled
    with pytest.raises(Cancelled):
        t.wait()
    assert dst.alloc.num_free == 32 and dst.alloc.holders() == ()
    dst.alloc.check_integrity()
    assert [tier.pinned(k) for k in st.keys] == [0, 0, 0] and not st.paths[0].exists()
    assert not t.cancel()  # settled already


def test_an_async_reload_polls_to_the_same_result(tmp_path: Path) -> None:
    tier, _, want = _stored(tmp_path, CANON)
    dst = CANON.make_pools(32)
    t = reload_async(tier, dst, CANON, "r2", A, free_host=False)
    while not t.poll():
        pass
    back = t.wait()
    assert back.num_tokens == 40 and dst.alloc.blocks_of("r2") == back.blocks
    assert all(dst.alloc.status(b) is BlockStatus.OWNED for b in back.blocks)
    assert torch.equal(_per_token(dst, list(back.blocks), 40), want)
    assert not t.cancel()


def test_an_async_offload_pins_the_blocks_and_a_cancel_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, blocks = _device(DEV, A)
    tier = DiskTier(tmp_path, MODEL, chunk_tokens=16)
    started, go = _gate(monkeypatch, moves, "chunk_data")
    t = offload_async(dev, DEV, tier, "r1", A, free_device=True)
    assert started.wait(10)
    assert all(dev.alloc.refcount(b) == 2 for b in blocks)  # the request and the transfer
    with pytest.raises(FrozenError):
        dev.alloc.check_write("r1", blocks[:1])  # read-only while it is read
    threading.Timer(0.05, go.set).start()
    assert t.cancel()
    with pytest.raises(Cancelled):
        t.wait()
    assert list(tmp_path.iterdir()) == []  # no temp file, no published chunk
    assert dev.alloc.blocks_of("r1") == tuple(blocks)  # free_device only after a publish
    assert all(dev.alloc.refcount(b) == 1 for b in blocks)
    done = offload_async(dev, DEV, tier, "r1", A, free_device=True).wait()
    assert tier.keys() == sorted(done.keys) and dev.alloc.num_free == 32


def test_concurrent_writers_of_one_prefix_end_with_whole_files(tmp_path: Path) -> None:
    dev, _ = _device(DEV, A)
    tier = DiskTier(tmp_path, MODEL, chunk_tokens=16)
    ts = [offload_async(dev, DEV, tier, "r1", A) for _ in range(4)]
    stored = [t.wait() for t in ts]
    assert all(s.keys == stored[0].keys for s in stored)
    assert tier.keys() == sorted(stored[0].keys) and not list(tmp_path.glob(".*"))
    got = tier.load(DEV, A, "r2")
    assert isinstance(got, Loaded) and got.num_tokens == 40 and got.checks == 10


def test_a_header_parsed_once_is_parsed_again_for_another_version_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, st, _ = _stored(tmp_path)
    parses = []
    real = disk.parse_manifest
    monkeypatch.setattr(disk, "parse_manifest", lambda h: parses.append(1) or real(h))
    assert tier.lookup(DEV, A) == 40 and parses == []  # the writer knows what it wrote
    reader = DiskTier(tmp_path, MODEL, chunk_tokens=16)  # another process's view
    assert reader.lookup(DEV, A) == 40 and len(parses) == 3
    assert reader.lookup(DEV, A) == 40 and len(parses) == 3  # the same files: parsed once
    data = bytearray(st.paths[1].read_bytes())
    data[40] ^= 0xFF  # a header byte, in a new file renamed over the chunk
    fresh = tmp_path / "fresh"
    fresh.write_bytes(bytes(data))
    fresh.replace(st.paths[1])
    assert tier.lookup(DEV, A) == 16 and reader.lookup(DEV, A) == 16  # not the old inode's


def test_a_key_removed_while_read_misses_for_new_readers_and_goes_with_the_last(
    tmp_path: Path,
) -> None:
    """The spec's eviction in two phases (HostEvict, then HostFree once the pins drain):
    ``remove`` of a key a reader holds unpublishes it for new readers at once. Before, a
    lookup after the removal still hit the key and pinned it again, so with readers that
    overlap an evicted key served hits and was never removed (it frees nothing)."""
    tier, st, _ = _stored(tmp_path, CANON)
    reader = tier.open_prefix(CANON, A)
    assert isinstance(reader, disk.Prefix) and tier.pinned(st.keys[0]) == 1
    assert tier.remove(st.keys[0])  # evicted while read: its bytes stay for the reader
    assert tier.lookup(CANON, A) == 0  # a new lookup misses it (was 40: a hit)
    assert isinstance(tier.open_prefix(CANON, A), Miss)
    assert tier.pinned(st.keys[0]) == 1 and st.paths[0].exists()
    reader.close()  # the last reader done: the file goes
    assert not st.paths[0].exists() and tier.pinned(st.keys[0]) == 0


def test_a_key_stored_again_after_a_removal_in_wait_is_published_and_kept(
    tmp_path: Path,
) -> None:
    """A store of the same prompt after the removal of its key (still read) publishes a
    new file: it hits at once and the old readers' end does not remove it."""
    tier, st, _ = _stored(tmp_path, CANON)
    reader = tier.open_prefix(CANON, A)
    assert isinstance(reader, disk.Prefix) and tier.remove(st.keys[0])
    dev, _ = _device(CANON, A)
    again = offload(dev, CANON, tier, None, "r1", A)
    assert again.keys == st.keys and tier.lookup(CANON, A) == 40
    reader.close()
    assert st.paths[0].exists() and tier.lookup(CANON, A) == 40
