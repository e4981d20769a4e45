"""Data-path ratios, measured side by side in one run on the seed's 64 MiB KV.

(a) handoff_over_copy    a full P/D handoff through the public API (``refimpl.api``:
                         ``handoff()`` of a ``Sender`` and a ``Receiver``: freeze + pin,
                         checksum, manifest, chunked send over the in-process transport,
                         verify, install, commit, release) against one raw ``copy_`` of
                         the same bytes; goal >= 0.8 on CPU
(b) roundtrip_over_copy  offload to the host pool and reload (reserve, copy, commit, free
                         on each side) against two raw copies
(c) checksum_gib_s       xxh3-64 over the pool's blocks; goal >= 10 GiB/s

A ratio is raw time / path time, from medians of interleaved rounds, so drift on a busy
machine hits both sides alike. The handoff step is a plug-in (``HANDOFFS``); the
engine's own handoff is measured by ``benchmarks/engine_handoff.py``.

    python benchmarks/datapath.py [--json] [--rounds N] [--block-size 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refimpl.api import KVGeometry, ModelIdentity, Receiver, Sender, handoff  # noqa: E402
from refimpl.checksum import bytes_checksum  # noqa: E402
from refimpl.pool import KVPool, copy_blocks  # noqa: E402
from refimpl.rankpools import RankPools  # noqa: E402
from refimpl.transport import InProcessTransport  # noqa: E402
from spec.manifest import RopeConfig  # noqa: E402

LAYERS, HEADS, TOKENS, HEAD_DIM = 16, 8, 1024, 128  # the seed's config, FP16: 64 MiB
REQ = "bench"


@dataclass
class World:
    src_pools: RankPools  # prefill worker's device pools, holding REQ
    dst_pools: RankPools  # decode worker's device pools
    host: KVPool  # pinned host pool for offload
    tx: Sender
    rx: Receiver
    token_ids: tuple[int, ...]
    raw_host: torch.Tensor  # baseline buffers, same bytes as the pools
    raw_dst: torch.Tensor

    @property
    def src(self) -> KVPool:
        return self.src_pools.pools[0]

    @property
    def dst(self) -> KVPool:
        return self.dst_pools.pools[0]


def make_world(block_size: int) -> World:
    g = KVGeometry(LAYERS, HEADS, HEAD_DIM, block_size, "float16")
    model = ModelIdentity("seed", RopeConfig(10000.0, HEAD_DIM))
    n = -(-TOKENS // block_size)
    src, dst = g.make_pools(n, device=None), g.make_pools(n, device=None)
    host = KVPool.host_pool(n, g.rank_pool_geometry())
    blocks = src.alloc.allocate(REQ, n)
    torch.manual_seed(0)
    kv = src.pools[0].kv
    kv.copy_(torch.randn(kv.shape, dtype=kv.dtype, device=kv.device))
    assert blocks == list(range(n))
    t = InProcessTransport()
    return World(
        src,
        dst,
        host,
        Sender(src, g, t, model),
        Receiver(dst, g, t, model),
        tuple(range(TOKENS)),
        torch.empty_like(host.kv),
        torch.empty_like(dst.pools[0].kv),
    )


# ---------------------------------------------------------------- the timed steps
def handoff_via_api(w: World, epoch: int) -> None:
    """Prefill -> decode handoff of REQ through ``refimpl.api.handoff``, every step of
    the protocol on real bytes (the receiver hashes every chunk before installing it
    and every block against the manifest before the commit)."""
    w.tx.forget(REQ)  # the last attempt ended: this one's epoch is the round's
    res = handoff(w.tx, w.rx, REQ, w.token_ids, epoch=epoch, free_source=False)
    assert len(res.received.blocks) == len(w.src.allocator.blocks_of(REQ)), res


def undo_handoff(w: World) -> None:
    w.dst.allocator.free(REQ)


HANDOFFS: dict[str, Callable[[World, int], None]] = {"api": handoff_via_api}


def offload_reload(w: World, epoch: int) -> None:
    """Offload REQ to host and reload it, with the bookkeeping of both pools."""
    blocks = list(w.src.allocator.blocks_of(REQ))
    host_ids = w.host.allocator.reserve(REQ, len(blocks), epoch=epoch)
    copy_blocks(w.src, blocks, w.host, host_ids, REQ)  # D2H on CUDA
    w.host.allocator.commit(REQ, epoch)
    w.src.allocator.free(REQ)  # GPU blocks go back to the pool while REQ is paused
    back = w.src.allocator.reserve(REQ, len(host_ids), epoch=epoch)
    copy_blocks(w.host, host_ids, w.src, back, REQ)  # H2D on CUDA
    w.src.allocator.commit(REQ, epoch)
    w.host.allocator.free(REQ)


def raw_copy(w: World) -> None:
    w.raw_dst.copy_(w.src.kv)


def raw_two_copies(w: World) -> None:
    w.raw_host.copy_(w.src.kv, non_blocking=True)
    w.raw_dst.copy_(w.raw_host, non_blocking=True)


def checksum_all(w: World) -> None:
    for view in w.host.host_bytes(range(w.host.capacity)):
        bytes_checksum(view)


# ---------------------------------------------------------------- measurement
def timed(cuda: bool, fn: Callable[..., object], *args: object) -> float:
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*args)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def cuda_copy_gib_s(dst: torch.Tensor, src: torch.Tensor, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return src.nbytes / 2**30 / statistics.median(samples)


def run(rounds: int, block_size: int, path: str) -> dict[str, float]:
    w = make_world(block_size)
    cuda = w.src.device.type == "cuda"
    handoff = HANDOFFS[path]
    w.host.kv.copy_(w.src.kv)
    samples: dict[str, list[float]] = {
        k: [] for k in ("copy", "handoff", "two_copies", "roundtrip", "xxh3")
    }
    for epoch in range(1, rounds + 3):  # two warm-up rounds, then interleaved samples
        s = {
            "copy": timed(cuda, raw_copy, w),
            "handoff": timed(cuda, handoff, w, epoch),
            "two_copies": timed(cuda, raw_two_copies, w),
            "roundtrip": timed(cuda, offload_reload, w, epoch),
            "xxh3": timed(False, checksum_all, w),
        }
        undo_handoff(w)
        if epoch > 2:
            for k, v in s.items():
                samples[k].append(v)
    assert torch.equal(w.dst.kv.cpu(), w.src.kv.cpu()), "handoff bytes differ"
    for pool in (w.src, w.dst, w.host):
        pool.allocator.check_integrity()
    assert w.tx.held() == {} and w.rx.held() == {}
    med = {k: statistics.median(v) for k, v in samples.items()}
    payload = w.src.kv.nbytes
    out = {
        "handoff_over_copy": med["copy"] / med["handoff"],
        "roundtrip_over_copy": med["two_copies"] / med["roundtrip"],
        "checksum_gib_s": payload / 2**30 / med["xxh3"],
        "payload_bytes": payload,
    }
    if cuda:
        out["d2h_gib_s"] = cuda_copy_gib_s(w.raw_host, w.src.kv, rounds)
        out["h2d_gib_s"] = cuda_copy_gib_s(w.raw_dst, w.raw_host, rounds)
    out.update({f"_{k}_ms": v * 1e3 for k, v in med.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the ratios as JSON")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-size", type=int, default=16, help="tokens per block")
    ap.add_argument("--path", choices=sorted(HANDOFFS), default="api")
    args = ap.parse_args()
    with torch.inference_mode():
        out = run(args.rounds, args.block_size, args.path)
    if args.json:
        print(json.dumps({k: v for k, v in out.items() if not k.startswith("_")}))
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"payload {out['payload_bytes'] / 2**20:.0f} MiB on {device}, block_size "
        f"{args.block_size}, {args.rounds} rounds, medians (ms): "
        + ", ".join(f"{k[1:-3]}={v:.2f}" for k, v in out.items() if k.endswith("_ms"))
    )
    print(f"{'metric':<22}{'value':>10}  goal")
    goals = {
        "handoff_over_copy": ">= 0.8 (CPU)",
        "checksum_gib_s": ">= 10",
    }
    for k, v in out.items():
        if not k.startswith("_") and k != "payload_bytes":
            print(f"{k:<22}{v:>10.3f}  {goals.get(k, '')}")


if __name__ == "__main__":
    main()
