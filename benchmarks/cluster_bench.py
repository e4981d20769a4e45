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

Where the time goes: the same run twice, side by side, with the workers' control
messages (the API's manifest, Ready, chunk headers, Ack) through the router's TCPStore
(``frames=False``: a doorbell poll and several store round trips per hop) and over the
pair groups themselves (``frames=True``, ``refimpl/cluster/pairs.py``); the mean
handoff (Ready sent -> committed, on decode) beside the raw transfer of its bytes.

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


def run(a: argparse.Namespace, model: ModelSpec, frames: bool) -> dict[str, object]:
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
            frames=frames,
        )
        rep = run_cluster(cfg)
    j = rep.to_json()
    out = {k: j[k] for k in ("handoff_gib_s", "raw_gib_s", "handoff_over_raw", "p50_ms", "p99_ms")}
    out["handoff_mib"] = rep.handoff_bytes / 2**20
    out["handoff_ms_mean"] = 1000 * rep.handoff_s / max(1, len(rep.handoff_ms))
    out["raw_ms_mean"] = 1000 * (rep.raw_s or 0.0) / max(1, len(rep.handoff_ms))
    out["control"] = "frames" if frames else "store"
    out["clean"] = rep.ok
    return out


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
    runs = [run(a, model, frames) for frames in (False, True)]  # side by side, one process
    if a.json:
        print(json.dumps(runs))
        return 0 if all(r["clean"] for r in runs) else 1
    print(f"{a.requests} handoffs each, prefill TP=2 -> decode TP=1")
    for r in runs:
        print(f"control over {r['control']:6s}: {r['handoff_mib']:.1f} MiB, handoff "
              f"{r['handoff_gib_s']:.3f} GiB/s, raw {r['raw_gib_s']:.3f} GiB/s, handoff_over_raw "
              f"{r['handoff_over_raw']:.3f}; mean handoff {r['handoff_ms_mean']:.1f} ms "
              f"(raw transfer {r['raw_ms_mean']:.1f} ms), p50 {r['p50_ms']:.1f}, p99 "
              f"{r['p99_ms']:.1f} ms{'' if r['clean'] else '  RUN NOT CLEAN'}")  # fmt: skip
    return 0 if all(r["clean"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
