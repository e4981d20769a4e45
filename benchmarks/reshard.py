"""Resharding throughput against a raw copy_ of the same bytes, measured side by side.

Seed config: 16 layers, 1024 tokens, 8 KV heads, head_dim 128, fp16, block size 16
=> 64 MiB of K+V.  For each TP pair the reshard (refimpl.reshard.reshard) and a plain
contiguous `copy_` of 64 MiB run back to back in each rep; the ratio is the median over reps
of reshard throughput / copy throughput (1.0 = as fast as a raw copy).

    python benchmarks/reshard.py            # table
    python benchmarks/reshard.py --json     # {"reshard_over_copy": {"2to1": r, ...}}

On a CPU shared with other busy processes, torch's multi-threaded strided copy waits for
its starved thread and can lose half its speed while the contiguous copy does not; compare
with --threads 1 before blaming the reshard.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
from refimpl.reshard import KVLayout, allocate, reshard  # noqa: E402

PAIRS = ((2, 1), (1, 2), (4, 2))


def _timed(fn: Callable[[], object], sync: bool) -> float:
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if sync:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(
    src_tp: int,
    dst_tp: int,
    *,
    layers: int = 16,
    tokens: int = 1024,
    kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    reps: int = 15,
    device: str = "cpu",
) -> dict[str, float]:
    dtype = torch.float16
    src_decl = KVLayout("heads_major", layers, kv_heads, block_size, head_dim, tp=src_tp)
    dst_decl = KVLayout("heads_major", layers, kv_heads, block_size, head_dim, tp=dst_tp)
    src = allocate(src_decl, tokens, dtype=dtype, device=device)
    for row in src.pools:
        row[0].normal_()
    src.num_tokens = tokens
    dst = allocate(dst_decl, tokens, dtype=dtype, device=device)
    nbytes = sum(row[0].numel() * row[0].element_size() for row in src.pools)
    raw_src = torch.randn(nbytes // 2, device=device).to(dtype)
    raw_dst = torch.empty_like(raw_src)
    sync = device.startswith("cuda")
    stats = reshard(src, dst)  # warm up both paths
    raw_dst.copy_(raw_src)
    t_copy, t_reshard = [], []
    for _ in range(reps):
        t_copy.append(_timed(lambda: raw_dst.copy_(raw_src), sync))
        t_reshard.append(_timed(lambda: reshard(src, dst), sync))
    c, r = statistics.median(t_copy), statistics.median(t_reshard)
    # each rep's copy and reshard run back to back, so their ratio shares that moment's load
    per_rep = [
        (stats.bytes_moved / tr) / (nbytes / tc) for tc, tr in zip(t_copy, t_reshard, strict=True)
    ]
    return {
        "bytes": float(stats.bytes_moved),
        "copies": float(stats.copies),
        "copy_gib_s": nbytes / c / 2**30,
        "reshard_gib_s": stats.bytes_moved / r / 2**30,
        "ratio": statistics.median(per_rep),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the ratios as JSON")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {f"{a}to{b}": measure(a, b, reps=args.reps, device=args.device) for a, b in PAIRS}
    if args.json:
        ratios = {k: round(v["ratio"], 3) for k, v in results.items()}
        print(json.dumps({"reshard_over_copy": ratios}))
        return 0
    threads = torch.get_num_threads()
    print(f"device={args.device} threads={threads} reps={args.reps}, 64 MiB fp16, block_size=16")
    head = ("pair", "MiB", "copies", "copy GiB/s", "reshard GiB/s", "ratio")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (6, 6, 7, 11, 14, 6), strict=True)))
    for name, v in results.items():
        print(
            f"{name:>6} {v['bytes'] / 2**20:6.0f} {v['copies']:7.0f} {v['copy_gib_s']:11.2f} "
            f"{v['reshard_gib_s']:14.2f} {v['ratio']:6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
