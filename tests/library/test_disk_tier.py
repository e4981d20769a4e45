"""The disk tier (issue #22 item 4): real files, published by an atomic rename, read back
verified; a torn, truncated or mismatched file is a miss; refusals leave nothing."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import safetensors.torch
import torch

from refimpl.api import DiskTier, KVGeometry, ModelIdentity, Stored, offload, reload
from refimpl.api.disk import Loaded, Miss
from refimpl.errors import CapacityError, MissError
from refimpl.rankpools import RankPools
from refimpl.tiers import files
from spec.manifest import RopeConfig

MODEL = ModelIdentity("disk-test", RopeConfig(10000.0, 8))
DEV = KVGeometry(2, 4, 8, 4, "bfloat16", layout="tokens_major", tp=2)
TOKENS = list(range(100, 110))  # 10 tokens: 3 blocks of 4, the last one partial


def _device(geo: KVGeometry = DEV, capacity: int = 16) -> tuple[RankPools, list[int]]:
    pools = geo.make_pools(capacity)
    blocks = pools.alloc.allocate("r1", geo.blocks_for(len(TOKENS)), epoch=0)
    g = torch.Generator().manual_seed(1)
    for p in pools.pools:
        p.kv[blocks] = torch.randn(p.kv[blocks].shape, generator=g).to(p.kv.dtype)
    return pools, blocks


def _per_token(pools: RankPools, blocks: list[int], n: int) -> torch.Tensor:
    full = pools.gather(blocks)  # [n, L, F, H, bs, D]
    return full.permute(0, 4, 1, 2, 3, 5).reshape(-1, *full.shape[1:4], full.shape[5])[:n]


@pytest.fixture
def stored(tmp_path: Path) -> tuple[DiskTier, Stored, torch.Tensor]:
    dev, blocks = _device()
    want = _per_token(dev, blocks, len(TOKENS))
    tier = DiskTier(tmp_path, MODEL)
    return tier, offload(dev, DEV, tier, None, "r1", TOKENS), want


def test_round_trip_across_geometries_is_bit_exact(tmp_path: Path) -> None:
    dev, blocks = _device()
    want = _per_token(dev, blocks, len(TOKENS))
    tier = DiskTier(tmp_path, MODEL)
    st = offload(dev, DEV, tier, None, "r1", TOKENS, free_device=True)
    assert dev.alloc.num_free == 16 and st.path.exists()  # freed once published
    assert tier.keys() == [st.key] and not list(tmp_path.glob(".*"))  # no temp file left
    other = KVGeometry(2, 4, 8, 2, "bfloat16")  # tp=1, another block size and layout
    dst = other.make_pools(16)
    back = reload(DiskTier(tmp_path, MODEL), None, dst, other, "r1", TOKENS, decode_room=4)
    assert len(back.blocks) == 7 and back.checks == 3  # the file's 3 blocks, verified once
    assert back.num_tokens == len(TOKENS) and dst.alloc.blocks_of("r1") == back.blocks
    assert torch.equal(_per_token(dst, list(back.blocks), len(TOKENS)), want)
    assert not st.path.exists()  # free_host: the file is unpublished after the commit


def test_the_file_is_safetensors_both_ways(stored: tuple[DiskTier, Stored, torch.Tensor]) -> None:
    tier, st, _ = stored
    tensors = safetensors.torch.load_file(str(st.path))  # the library reads our file
    assert list(tensors) == ["kv"] and tensors["kv"].shape == (3, 2, 2, 4, 4, 8)
    other = st.path.with_name("copy.safetensors")
    with safetensors.safe_open(str(st.path), "pt") as f:
        meta = f.metadata()
    safetensors.torch.save_file(tensors, str(other), metadata=meta)  # the library writes
    other.replace(st.path)
    got = tier.load(DEV, TOKENS, "again")
    assert isinstance(got, Loaded) and got.checks == 3


def _load(tier: DiskTier) -> Loaded | Miss:
    # another reader (a restart): the writer's own tier keeps the header it wrote for
    # that inode's version, and an in-place edit may land in the same timestamp tick
    return DiskTier(tier.directory, MODEL).load(DEV, TOKENS, "r2")


def _rewrite(path: Path, edit: Callable[[bytearray], bytearray | bytes]) -> None:
    path.write_bytes(edit(bytearray(path.read_bytes())))


def _header_len(data: bytearray) -> int:
    return int(struct.unpack("<Q", bytes(data[:8]))[0])


def _flip(at: int | Callable[[bytearray], int]) -> Callable[[bytearray], bytearray]:
    def edit(d: bytearray) -> bytearray:
        i = at(d) if callable(at) else at
        d[i] ^= 0xFF
        return d

    return edit


TORN: dict[str, Callable[[bytearray], bytearray | bytes]] = {
    "empty": lambda d: d[:0],
    "length only": lambda d: d[:8],
    "half the header": lambda d: d[: 8 + _header_len(d) // 2],
    "header, no data": lambda d: d[: 8 + _header_len(d)],
    "one data byte short": lambda d: d[:-1],
    "one byte too many": lambda d: d + b"\0",
    "a data byte flipped": _flip(lambda d: len(d) - 3),
    "a header byte flipped": _flip(20),
    "header length past the end": lambda d: struct.pack("<Q", 1 << 40) + d[8:],
}


@pytest.mark.parametrize("how", sorted(TORN))
def test_a_torn_or_corrupt_file_is_a_miss_never_a_hit(
    how: str, stored: tuple[DiskTier, Stored, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, st, _ = stored
    _rewrite(st.path, TORN[how])
    if how != "a data byte flipped":  # caught on the header: nothing may be allocated
        monkeypatch.setattr(KVGeometry, "make_pools", lambda *a, **k: pytest.fail("allocated"))
    got = _load(tier)
    assert isinstance(got, Miss), how


def test_a_header_that_lies_about_sizes_is_refused_before_allocating(
    stored: tuple[DiskTier, Stored, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, st, _ = stored
    text = st.path.read_bytes()
    n = _header_len(bytearray(text))
    head = text[8 : 8 + n].replace(b'"shape":[3,', b'"shape":[9999999,')
    st.path.write_bytes(struct.pack("<Q", len(head)) + head + text[8 + n :])
    monkeypatch.setattr(KVGeometry, "make_pools", lambda *a, **k: pytest.fail("allocated"))
    got = _load(tier)
    assert isinstance(got, Miss) and "bytes for shape" in got.reason


def test_a_file_of_another_model_or_other_tokens_is_a_miss(
    stored: tuple[DiskTier, Stored, torch.Tensor],
) -> None:
    tier, st, _ = stored
    other = DiskTier(tier.directory, ModelIdentity("another-model", MODEL.rope))
    st.path.rename(other.path(other.key(DEV, TOKENS)))  # the right bytes under its name
    got = other.load(DEV, TOKENS, "r2")
    assert isinstance(got, Miss) and "model_id" in got.reason
    shifted = [t + 1 for t in TOKENS]
    other.path(other.key(DEV, TOKENS)).rename(tier.path(tier.key(DEV, shifted)))
    got = tier.load(DEV, shifted, "r2")
    assert isinstance(got, Miss) and "token_ids" in got.reason


def test_reload_of_a_miss_raises_and_holds_nothing(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, MODEL)
    dst = DEV.make_pools(16)
    with pytest.raises(MissError, match="not published"):
        reload(tier, None, dst, DEV, "r1", TOKENS)
    assert dst.alloc.num_free == 16


def test_reload_refused_for_room_leaves_the_device_and_the_file(
    stored: tuple[DiskTier, Stored, torch.Tensor],
) -> None:
    tier, st, _ = stored
    dst = DEV.make_pools(2)  # 3 blocks needed
    with pytest.raises(CapacityError):
        reload(tier, None, dst, DEV, "r1", TOKENS)
    assert dst.alloc.num_free == 2 and st.path.exists()


def test_a_failed_store_publishes_nothing_and_keeps_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, blocks = _device()
    tier = DiskTier(tmp_path, MODEL)

    def no_room(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(OSError, match="No space"):
        offload(dev, DEV, tier, None, "r1", TOKENS, free_device=True)
    assert list(tmp_path.iterdir()) == []  # no temp file, no published name
    assert dev.alloc.blocks_of("r1") == tuple(blocks) and dev.alloc.num_free == 13


def test_a_restart_removes_dead_writers_temp_files_and_adopts_published(
    stored: tuple[DiskTier, Stored, torch.Tensor],
) -> None:
    tier, st, _ = stored
    d = tier.directory
    dead, live = d / f".{st.key}.999999999.ab12.tmp", d / f".{st.key}.{os.getpid()}.cd34.tmp"
    for p in (dead, live, d / "notes.txt"):
        p.write_bytes(b"half")
    again = DiskTier(d, MODEL)
    assert again.orphans_removed == [dead.name] and again.adopted == [st.key]
    assert live.exists() and (d / "notes.txt").exists()
    assert files.sweep_orphans(d, all_writers=True) == [live.name]


def test_two_writers_of_one_key_never_share_a_temp_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = os.replace

    def spy(a: str, b: str) -> None:
        seen.append(Path(a).name)
        real(a, b)

    monkeypatch.setattr(os, "replace", spy)
    dev, _ = _device()
    tier = DiskTier(tmp_path, MODEL)
    offload(dev, DEV, tier, None, "r1", TOKENS)
    offload(dev, DEV, tier, None, "r1", TOKENS)
    assert len(seen) == 2 and seen[0] != seen[1] and tier.keys() == [tier.key(DEV, TOKENS)]


def test_a_load_into_reused_staging_gives_its_blocks_back_on_a_miss(
    stored: tuple[DiskTier, Stored, torch.Tensor],
) -> None:
    tier, st, _ = stored
    staging = KVGeometry.from_manifest_source(st.manifest).make_pools(8)
    got = tier.load(DEV, TOKENS, "r2", into=staging)
    assert isinstance(got, Loaded) and got.pools is staging and len(got.blocks) == 3
    staging.alloc.free("r2")
    with pytest.raises(ValueError, match="do not match"):
        tier.load(DEV, TOKENS, "r2", into=DEV.make_pools(8))  # not the file's geometry
    _rewrite(st.path, TORN["a data byte flipped"])  # the last block's bytes
    got = tier.load(DEV, TOKENS, "r2", into=staging)
    assert isinstance(got, Miss) and "block 2" in got.reason and staging.alloc.num_free == 8
    assert not st.path.exists()  # a hit that failed its checksum is unpublished
