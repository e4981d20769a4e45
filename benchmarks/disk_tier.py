"""The disk tier (issue #22): a round trip against raw file I/O, and writers killed at scale.

(a) disk_over_raw   ``DiskTier.store`` (block checksums for the manifest, safetensors
                    header, write, fsync, atomic rename, fsync of the directory) then
                    ``DiskTier.load`` (header and manifest validated, read, every block
                    verified) against a raw ``write`` + ``fsync`` + ``read`` of the same
                    bytes into a preallocated buffer; raw time / tier time, medians of
                    interleaved rounds on the seed's 64 MiB KV. Goal >= 0.8.
                    ``disk_over_raw_given_checksums``: the same with the manifest's
                    checksums already at hand (an offload: the handoff's sender hashed
                    them), the load still verifying every block.
(c) reload_over_load_file  ``reload`` (a DiskTier's chunks of 256 tokens: the longest
                    prefix opened and checked, every block read into the device pools
                    and verified) against ``safetensors.torch.load_file`` of one file of
                    the same bytes + ``copy_`` into the same device blocks; tier time /
                    library time (lower is better; goal <= 1.5). By the tier that wrote
                    the chunks (their headers kept as written) and by a fresh
                    ``DiskTier`` of the folder (another process: every header parsed).
    offload_over_save_file  ``offload`` (each block hashed once, the chunks written,
                    fsynced, renamed, the folder fsynced) against ``save_file`` of the
                    request's blocks + ``fsync``; tier / library (goal <= 1.3).
                    Both for a canonical device (tp=1 heads_major: direct reads and
                    writes) and a tp=2 tokens_major one (one staging copy each way).
(b) --kills N       ``refimpl.testing.crash.disk.kill_rounds``: N rounds of one writer and
                    N of two writers of the same keys, each killed with SIGKILL at a random
                    point, then a restart: kills survived, orphans removed, reported keys
                    kept, hits verified, failures (must be 0).

Both run in the directory given (default: a fresh temp directory on the disk of
``$TMPDIR``); reads come from the page cache on both sides.

    python benchmarks/disk_tier.py [--json] [--rounds 5] [--kills 0] [--dir DIR]
                                   [--only round_trip,library]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import safetensors.torch  # noqa: E402

from refimpl.api import DiskTier, HostTier, KVGeometry, offload, reload  # noqa: E402
from refimpl.api.disk import Loaded  # noqa: E402
from refimpl.checksum import block_checksum, byte_view, writable_byte_view  # noqa: E402
from refimpl.engine.data import RankPools, gen  # noqa: E402
from refimpl.memory import register_kv_caches  # noqa: E402
from refimpl.memory.registered import RegisteredPools  # noqa: E402
from refimpl.testing.crash.disk import MODEL, kill_rounds, sample_file  # noqa: E402
from refimpl.tiers import kvio  # noqa: E402
from spec.manifest import Manifest  # noqa: E402

GEO = KVGeometry(16, 8, 128, 16, "float16")  # the seed's config: 1024 tokens = 64 MiB


def _raw(path: Path, kv: torch.Tensor, buf: torch.Tensor) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = byte_view(kv)
    while view.nbytes:
        view = view[os.write(fd, view[: 16 << 20]) :]
    os.fsync(fd)
    os.close(fd)
    with open(path, "rb") as f:
        out, got = writable_byte_view(buf), 0
        while got < out.nbytes:
            got += f.readinto(out[got:])  # type: ignore[attr-defined]
    dt = time.perf_counter() - t0
    path.unlink()
    return dt


def _tier(
    tier: DiskTier, base: Manifest, kv: torch.Tensor, staging: RankPools
) -> tuple[float, float]:
    t0 = time.perf_counter()
    sums = [block_checksum(b) for b in kv]  # what the manifest states, from the bytes
    t_sums = time.perf_counter() - t0
    m = Manifest.from_json_dict({**base.to_json_dict(), "block_checksums": sums})
    stored = tier.store(m, kv)
    got = tier.load(GEO, m.token_ids, "bench", into=staging)
    dt = time.perf_counter() - t0
    if not isinstance(got, Loaded):
        raise SystemExit(f"the round trip missed: {got.reason}")
    staging.alloc.free("bench")
    tier.remove(stored.key)
    return dt, t_sums


def round_trip(directory: Path, rounds: int) -> dict[str, float]:
    base, _ = sample_file(GEO, 64)  # 64 blocks of 16 tokens: 1024 tokens
    kv = gen((64, *GEO.rank_pool_geometry().block_shape), GEO.torch_dtype, "bench")
    buf = torch.empty_like(kv)  # the raw side reads into memory allocated once,
    staging = GEO.make_pools(64)  # and so does the tier (``DiskTier.load(into=...)``)
    tier = DiskTier(directory, MODEL)
    _raw(directory / "raw.bin", kv, buf)  # one untimed round each: files, pages, caches
    _tier(tier, base, kv, staging)
    raw, disk, sums = [], [], []
    for _ in range(rounds):  # interleaved: drift hits both sides alike
        raw.append(_raw(directory / "raw.bin", kv, buf))
        dt, t_sums = _tier(tier, base, kv, staging)
        disk.append(dt)
        sums.append(dt - t_sums)
    nbytes = kv.numel() * kv.element_size()
    r, d = statistics.median(raw), statistics.median(disk)
    return {
        "mib": nbytes / 2**20,
        "raw_s": r,
        "disk_s": d,
        "raw_gib_s": 2 * nbytes / r / 2**30,  # written and read
        "disk_gib_s": 2 * nbytes / d / 2**30,
        "disk_over_raw": r / d,
        # the manifest's checksums already computed (an offload: the handoff's sender
        # hashed them); the load still verifies every block
        "disk_over_raw_given_checksums": r / statistics.median(sums),
    }


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _library_round(
    path: Path, kv: list[torch.Tensor], dst: list[torch.Tensor]
) -> tuple[float, float]:
    t0 = time.perf_counter()
    safetensors.torch.save_file({f"kv{r}": t for r, t in enumerate(kv)}, str(path))
    _fsync(path)
    t1 = time.perf_counter()
    got = safetensors.torch.load_file(str(path))
    for r, t in enumerate(dst):
        t.copy_(got[f"kv{r}"])
    t2 = time.perf_counter()
    path.unlink()
    return t1 - t0, t2 - t1


def _tier_round(
    tier: DiskTier | HostTier, dev: RankPools, geo: KVGeometry, tokens: list[int],
    dst: list[int] | None,
) -> tuple[float, float, float]:  # fmt: skip
    t0 = time.perf_counter()
    st = offload(dev, geo, tier, None, "src", tokens)
    t1 = time.perf_counter()
    back = reload(tier, None, dev, geo, "dst", tokens, free_host=False, blocks=dst)
    t2 = time.perf_counter()
    _free(dev, "dst")
    t3 = t4 = 0.0
    if isinstance(tier, DiskTier):
        reader = DiskTier(tier.directory, MODEL)  # another process's view: every header parsed
        t3 = time.perf_counter()
        again = reload(reader, None, dev, geo, "dst", tokens, free_host=False, blocks=dst)
        t4 = time.perf_counter()
        _free(dev, "dst")
        if again.num_tokens != len(tokens):
            raise SystemExit(f"reload hit {again.num_tokens} of {len(tokens)} tokens")
    if back.num_tokens != len(tokens):
        raise SystemExit(f"reload hit {back.num_tokens} of {len(tokens)} tokens")
    for k in st.keys:
        tier.remove(k)
    return t1 - t0, t2 - t1, t4 - t3


def _free(dev: RankPools, rid: str) -> None:
    if isinstance(dev, RegisteredPools):
        dev.release(rid)  # the engine frees its blocks (kvown never does)
    else:
        dev.alloc.free(rid)


Device = tuple[RankPools, list[torch.Tensor], list[torch.Tensor], list[int] | None]


def _kvown(geo: KVGeometry, n: int, capacity: int = 0) -> Device:
    """kvown's own pools; the library saves each rank's contiguous run of blocks."""
    dev = geo.make_pools(capacity or 2 * n)
    src = dev.alloc.allocate("src", n)  # blocks 0..n-1, then "dst" gets n..2n-1
    for p in dev.pools:
        p.kv[src] = gen(p.kv[src].shape, p.kv.dtype, "bench", id(p) % 7)
    return dev, [p.kv[:n] for p in dev.pools], [p.kv[n : 2 * n] for p in dev.pools], None


def _registered(geo: KVGeometry, n: int, name: str) -> Device:
    """An engine's per-layer caches (vLLM's FlashInfer HND or FlashAttention NHD), its
    blocks 0..n-1 the source, n..2n-1 the destination it gives; the library saves each
    layer's (and field's) contiguous run of the source blocks and copies them back."""
    g = geo.rank_pool_geometry()
    shape = (2 * n, 2, g.kv_heads, g.block_size, g.head_dim)  # HND bytes [N, 2, H, T, D]
    if name == "flashinfer_hnd":
        raw = [gen(shape, g.dtype, "bench", li) for li in range(g.num_layers)]
        layers = [t.transpose(2, 3) for t in raw]  # vLLM's shape [N, 2, T, H, D]
        runs = [(t[:n], t[n:]) for t in raw]
    else:  # flash_attn: [2, N, T, H, D]
        shape = (2, 2 * n, g.block_size, g.kv_heads, g.head_dim)
        layers = [gen(shape, g.dtype, "bench", li) for li in range(g.num_layers)]
        runs = [(lv[k, :n], lv[k, n:]) for lv in layers for k in range(2)]
    dev = register_kv_caches(geo, layers, name)
    dev.adopt("src", range(n))
    return dev, [r[0] for r in runs], [r[1] for r in runs], list(range(n, 2 * n))


def against_library(
    directory: Path, rounds: int, geo: KVGeometry, device: str = "kvown"
) -> dict[str, float]:
    """Tier offload/reload vs save_file + fsync / load_file + copy_, same bytes, same run;
    the same against a ``HostTier`` (no library counterpart: its time beside them)."""
    n = 64  # 64 blocks of 16 tokens = 1024 tokens = 64 MiB: 4 chunk files
    tokens = list(range(n * geo.block_size))
    dev, kv, out, dst = _kvown(geo, n) if device == "kvown" else _registered(geo, n, device)
    tier = DiskTier(directory, MODEL)
    host = HostTier(MODEL, 2 * n * geo.canonical_block_bytes)
    _library_round(directory / "lib.safetensors", kv, out)  # untimed: files, pages, caches
    _tier_round(tier, dev, geo, tokens, dst)
    _tier_round(host, dev, geo, tokens, dst)
    lib_w, lib_r, tier_w, tier_r, fresh_r, host_w, host_r = [], [], [], [], [], [], []
    for _ in range(rounds):  # interleaved: drift hits both sides alike
        w, r = _library_round(directory / "lib.safetensors", kv, out)
        lib_w.append(w)
        lib_r.append(r)
        w, r, f = _tier_round(tier, dev, geo, tokens, dst)
        tier_w.append(w)
        tier_r.append(r)
        fresh_r.append(f)
        w, r, _ = _tier_round(host, dev, geo, tokens, dst)
        host_w.append(w)
        host_r.append(r)
    med = statistics.median
    return {
        "mib": n * geo.canonical_block_bytes / 2**20,
        "direct": float(kvio.direct(dev, geo.block_size)),  # no staging copy either way
        "save_file_fsync_s": med(lib_w),
        "offload_s": med(tier_w),
        "load_file_copy_s": med(lib_r),
        "reload_s": med(tier_r),
        "offload_over_save_file": med(tier_w) / med(lib_w),
        "reload_over_load_file": med(tier_r) / med(lib_r),
        # the writer's tier keeps each chunk's header as written; another reader parses it
        "reload_fresh_reader_s": med(fresh_r),
        "reload_fresh_reader_over_load_file": med(fresh_r) / med(lib_r),
        "host_offload_s": med(host_w),
        "host_reload_s": med(host_r),
    }


def longer_prompt(directory: Path) -> dict[str, int]:
    """A 1024-token prompt stored, then a 1280-token one starting with it: the tokens each
    tier hits (the stored 1024 on both) and reloads, verified."""
    geo, n = GEO, 64
    dev, _, _, _ = _kvown(geo, n, 3 * n)
    short = list(range(n * geo.block_size))
    longer = short + list(range(10**6, 10**6 + 256))
    out: dict[str, int] = {}
    for name, tier in (
        ("disk", DiskTier(directory, MODEL)),
        ("host", HostTier(MODEL, 2 * n * geo.canonical_block_bytes)),
    ):
        offload(dev, geo, tier, None, "src", short)
        out[f"{name}_lookup_tokens"] = tier.lookup(geo, longer)
        back = reload(tier, None, dev, geo, "dst", longer, free_host=False)
        out[f"{name}_reloaded_tokens"] = back.num_tokens
        out[f"{name}_blocks_verified"] = back.checks
        dev.alloc.free("dst")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kills", type=int, default=0, help="kill rounds per writer count")
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--only", default="round_trip,library,prefix", help="comma-separated parts")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)  # both sides' copies alike
    only = set(a.only.split(","))
    with tempfile.TemporaryDirectory(prefix="kvown-disk-bench-", dir=a.dir) as d:
        out: dict[str, object] = {}
        if "round_trip" in only:
            out["round_trip"] = round_trip(Path(d) / "rt", a.rounds)
        if "library" in only:
            out["library_canonical"] = against_library(Path(d) / "lc", a.rounds, GEO)
            tp2 = GEO.with_(tp=2, layout="tokens_major")
            out["library_tp2_tokens_major"] = against_library(Path(d) / "lt", a.rounds, tp2)
            for name, lay in (("flashinfer_hnd", "heads_major"), ("flash_attn", "tokens_major")):
                out[f"library_registered_{name}"] = against_library(
                    Path(d) / f"lr-{name}", a.rounds, GEO.with_(layout=lay), name
                )
        if "prefix" in only:
            out["longer_prompt"] = longer_prompt(Path(d) / "pf")
        for writers in (1, 2) if a.kills else ():
            t0 = time.perf_counter()
            rep = kill_rounds(Path(d) / f"kill{writers}", a.kills, seed=writers, writers=writers)
            out[f"kills_{writers}_writer"] = {
                "rounds": rep.rounds,
                "kills_survived": rep.kills,
                "orphans_removed": rep.orphans,
                "reported_keys_kept": rep.reported,
                "hits_verified": rep.hits_verified,
                "failures": rep.failures,
                "seconds": round(time.perf_counter() - t0, 1),
            }
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(k, v)
    kills = [v for k, v in out.items() if k.startswith("kills_")]
    return 1 if any(v["failures"] for v in kills) else 0  # type: ignore[index]


if __name__ == "__main__":
    raise SystemExit(main())
