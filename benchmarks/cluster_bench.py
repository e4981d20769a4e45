"""Handoff throughput through the cluster against raw torch.distributed send/recv of the
same bytes between the same processes, in one run.

A `kvown cluster` run without faults (2 prefill ranks -> 1 decode, gloo on loopback) on a
bigger KV geometry than the tests' (default: 8 layers, 8 KV heads, head_dim 128, block
size 64, float32: 4 MiB per block, 2 MiB per rank shard), then, between the same
processes, the raw baseline: every handoff's per-rank byte counts sent again with plain
isend/irecv (the senders post first, decode times each transfer from posting its
receives to their completion).

    handoff GiB/s     = bytes handed off / sum over handoffs of (Ready sent -> committed)
    raw GiB/s         = the same bytes / sum of the raw transfer times
    handoff_over_raw  = handoff GiB/s / raw GiB/s            (goal: >= 0.7)

"Where the rest goes" splits the mean handoff into its phases, measured on decode:
Ready -> every RankDone (control round trips through the TCPStore, prefill's reaction),
-> bytes received, -> verified (xxh3 of every block, twice: per rank and joined), and
-> committed (staging, reshard TP 2 -> 1, commit).

    python benchmarks/cluster_bench.py            # table
    python benchmarks/cluster_bench.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
from refimpl.cluster.router import ClusterConfig, run_cluster  # noqa: E402
from refimpl.cluster.workload import ModelSpec  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--max-inflight", type=int, default=2)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    model = ModelSpec(
        layers=a.layers,
        q_heads=a.kv_heads,
        kv_heads=a.kv_heads,
        head_dim=a.head_dim,
        block_size=a.block_size,
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ClusterConfig(
            requests=a.requests,
            model=model,
            steps=1,
            max_inflight=a.max_inflight,
            timeout_s=10.0,
            deadline_s=600.0,
            capacity=32,
            log_dir=tmp,
        )
        rep = run_cluster(cfg)
    j = rep.to_json()
    out = {k: j[k] for k in ("handoff_gib_s", "raw_gib_s", "handoff_over_raw", "p50_ms", "p99_ms")}
    out["handoff_mib"] = rep.handoff_bytes / 2**20
    out["phases_ms"] = j["handoff_phases_ms"]
    out["clean"] = rep.ok
    if a.json:
        print(json.dumps(out))
        return 0 if rep.ok else 1
    ph = out["phases_ms"]
    print(f"{a.requests} handoffs, {out['handoff_mib']:.1f} MiB, prefill TP=2 -> decode TP=1")
    print(f"handoff {out['handoff_gib_s']:.3f} GiB/s, raw send/recv {out['raw_gib_s']:.3f} "
          f"GiB/s, handoff_over_raw {out['handoff_over_raw']:.3f}")  # fmt: skip
    print(f"p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms per handoff")
    prev, names = 0.0, ("rankdone", "data", "verified", "commit")
    labels = ("Ready -> RankDones", "-> bytes in", "-> verified", "-> committed")
    for k, label in zip(names, labels, strict=True):
        print(f"  {label:20s} {ph[k] - prev:8.2f} ms")
        prev = ph[k]
    print("run clean" if rep.ok else "RUN NOT CLEAN: " + json.dumps(j))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
