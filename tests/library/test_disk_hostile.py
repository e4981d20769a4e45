"""The disk tier against what a crash or another program leaves in its folder (issue #34,
item 4): a load reads only a regular file of the tier's own folder (a FIFO, a folder, a
device or a symlink at a key's name is a miss saying which; a FIFO used to hang the load,
a folder raised, a symlink was followed out of the tier); a header's member count is
checked before it is parsed (junk metadata keys cost a count, not a dictionary); the
orphan sweep skips what is not a writer's temp file and never raises; a bad tier path (an
empty one too: not the working folder) is one ``TierPathError``; every whole published
file is kept."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
import torch

from refimpl.api import DiskTier, KVGeometry, offload
from refimpl.api.disk import Loaded, Miss, TierPathError
from refimpl.tiers import files
from tests.library.test_disk_tier import DEV, MODEL, TOKENS, _device


def _stored(d: Path) -> tuple[DiskTier, Path]:
    dev, _ = _device()
    tier = DiskTier(d, MODEL)
    st = offload(dev, DEV, tier, None, "r1", TOKENS)
    return tier, st.path


def _miss(tier: DiskTier, what: str) -> None:
    got = tier.load(DEV, TOKENS, "r2")
    assert isinstance(got, Miss) and what in got.reason, got


def test_a_fifo_at_a_keys_name_is_a_miss_not_a_hang(tmp_path: Path) -> None:
    tier, path = _stored(tmp_path)
    path.unlink()
    os.mkfifo(path)
    _miss(tier, "a FIFO, not a regular file")


def test_a_folder_at_a_keys_name_is_a_miss(tmp_path: Path) -> None:
    tier, path = _stored(tmp_path)
    path.unlink()
    path.mkdir()
    _miss(tier, "a folder, not a regular file")
    assert tier.keys() == []  # not adopted either


def test_a_symlink_out_of_the_tier_is_not_followed(tmp_path: Path) -> None:
    tier, path = _stored(tmp_path / "tier")
    outside = tmp_path / "elsewhere.safetensors"
    path.replace(outside)  # a whole, valid file, but not in the tier's folder
    path.symlink_to(outside)
    assert DiskTier(tmp_path / "tier", MODEL).adopted == []
    _miss(tier, "a symlink")
    path.unlink()
    outside.replace(path)
    assert isinstance(tier.load(DEV, TOKENS, "r3"), Loaded)  # the file itself still reads


def test_the_sweep_skips_what_it_cannot_judge_and_keeps_every_published_file(
    tmp_path: Path,
) -> None:
    tier, path = _stored(tmp_path)
    key = path.name.split(".")[0]
    odd = {
        f".{key}.{1 << 31}.ab.tmp": "file",  # a "pid" no process has: os.kill overflowed
        f".{key}.{'9' * 40}.ab.tmp": "file",
        f".{key}.0.ab.tmp": "file",  # pid 0: kill(0) is the whole process group
        f".{key}.999999998.cd.tmp": "dir",  # a folder with a temp name
        f".{key}.999999997.ef.tmp": "link",  # a symlink with a temp name
    }
    for name, kind in odd.items():
        p = tmp_path / name
        if kind == "file":
            p.write_bytes(b"junk")
        elif kind == "dir":
            p.mkdir()
            (p / "inside").write_bytes(b"x")
        else:
            p.symlink_to(path)
    dead = tmp_path / f".{key}.999999999.ab12.tmp"
    dead.write_bytes(b"half")
    again = DiskTier(tmp_path, MODEL)
    assert again.orphans_removed == [dead.name] and again.adopted == [key]
    assert all((tmp_path / n).exists() or (tmp_path / n).is_symlink() for n in odd)
    assert files.sweep_orphans(tmp_path, all_writers=True) == []
    assert isinstance(again.load(DEV, TOKENS, "r2"), Loaded)


@pytest.mark.parametrize("kind", ["file", "nul", "unwritable", "empty"])
def test_a_bad_tier_path_is_one_clear_error(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad: str | Path
    if kind == "empty":  # Path("") is the working folder: it was swept and adopted
        monkeypatch.chdir(tmp_path)
        bad, what = "", "an empty path"
    elif kind == "file":
        bad = tmp_path / "f"
        bad.write_bytes(b"")
        what = "not a folder|Not a directory|exists"
    elif kind == "nul":
        bad, what = Path(str(tmp_path) + "/a\0b"), "null"
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write anywhere")
        bad = tmp_path / "ro"
        bad.mkdir(mode=0o500)
        what = "not readable and writable"
    with pytest.raises(TierPathError, match=what):
        DiskTier(bad, MODEL)


def test_junk_metadata_keys_are_counted_before_any_parse(tmp_path: Path) -> None:
    tier, path = _stored(tmp_path)
    junk = {f"k{i}": "" for i in range(200_000)}
    kv = torch.zeros(4, dtype=torch.uint8)
    path.unlink()
    files.write_published(tmp_path, path.name.split(".")[0], junk, [("kv", kv)])
    size = path.stat().st_size
    tracemalloc.start()
    try:
        got = tier.load(DEV, TOKENS, "r2")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(got, Miss) and "more than 4096 members" in got.reason
    assert peak <= 6 * size + (1 << 20), f"{peak} bytes for a {size}-byte file"


def test_a_foreign_geometry_in_a_whole_file_is_a_miss(tmp_path: Path) -> None:
    tier, _ = _stored(tmp_path)
    other = KVGeometry(2, 4, 8, 4, "float32", layout="tokens_major", tp=2)
    got = tier.load(other, TOKENS, "r2")
    assert isinstance(got, Miss)


def test_a_big_metadata_value_costs_twice_the_header_not_five_times(tmp_path: Path) -> None:
    """A header near the size cap (the issue's 60-90 MB of metadata) must fit the 256 MB
    bound: the header's bytes go once decoded (no padding-stripped copy), the skeleton is
    translated a MB at a time, so the peak is the text and the value it holds (plus 2 MB:
    2.5x at 4 MB; 5x before, 450 MB for a 90 MB header)."""
    blob = "x" * (4 << 20)
    kv = torch.zeros(4, dtype=torch.uint8)
    files.write_published(tmp_path, "big", {"m": blob}, [("kv", kv)])
    del blob
    path = tmp_path / "big.safetensors"
    size = path.stat().st_size
    with path.open("rb") as f:
        tracemalloc.start()
        try:
            head = files.read_header(f)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert len(head.metadata["m"]) == 4 << 20
    assert peak <= 3 * size, f"{peak / size:.2f} bytes per header byte"
