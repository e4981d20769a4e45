"""Registered memory (issue #31 item 1): an engine's cache -> an engine's cache through
kvown, against raw copies of the same bytes, side by side in one run.

32 layers, 8 KV heads, head dim 128, bfloat16, blocks of 16 tokens (2 MiB a block over
every layer); ``--mib`` of KV per request (default 64: 32 blocks), the scheduler's ids
neither sorted nor contiguous on either side. Both sides' caches are registered
(``refimpl.memory.register_kv_caches``): no kvown pool anywhere. Paths, in one process
over ``InProcessTransport`` (``handoff()``, then ``release`` on both sides):

    fa_whole     FlashAttention per layer [2, N, 16, 8, 128]: whole blocks
    fa_layers    the same, layer by layer (``layered=True``)
    hnd_whole    FlashAttention HND per layer (bytes [2, N, 8, 16, 128]: kvown's canonical
                 heads_major blocks, so no re-layout for the checksums): whole blocks
    cross_whole  the NHD cross-layer tensor [N, 32, 2, 16, 8, 128]: whole blocks
    cross_layers the same, layer by layer
    via_pools    before registered memory: the FlashAttention caches into kvown's own
                 pools (``refimpl.adapters.vllm``, per layer), ``handoff()`` pool to pool,
                 and out into the destination caches

Raw operations of the same bytes: ``copy_`` (one contiguous buffer into another: the
issue's "raw copy") and ``blocks`` (the engine's own cache-to-cache copy of those block
ids: per layer one indexed gather + scatter, FlashAttention layout). Each figure is a
path's median over the raw ``copy_``'s median from interleaved rounds (the ``blocks``
ratio too); every timed handoff is checked bit-exact outside the timer.

    python benchmarks/memory/registered_handoff.py [--rounds 5] [--mib 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from refimpl import KVGeometry, ModelIdentity, Receiver, Sender, handoff  # noqa: E402
from refimpl.adapters.vllm import blocks_to_vllm_layer, vllm_layer_to_blocks  # noqa: E402
from refimpl.memory import register_kv_caches  # noqa: E402
from refimpl.transport import InProcessTransport  # noqa: E402
from spec.manifest import RopeConfig  # noqa: E402

# isort: split
import torch  # noqa: E402

L, H, D, BS = 32, 8, 128, 16
G = KVGeometry(L, H, D, BS, "bfloat16", layout="tokens_major")
MODEL = ModelIdentity("bench", RopeConfig(theta=10000.0, rotary_dim=D))
WARMUP = 1
PATHS = ("fa_whole", "fa_layers", "hnd_whole", "cross_whole", "cross_layers", "via_pools")
GH = G.with_(layout="heads_major")


def _ids(n: int, cap: int, seed: int) -> list[int]:
    return torch.randperm(cap, generator=torch.Generator().manual_seed(seed))[:n].tolist()


def _setup(nblocks: int) -> dict[str, Any]:
    cap = nblocks * 2
    g = torch.Generator().manual_seed(7)
    fa_src = [torch.randn(2, cap, BS, H, D, generator=g).bfloat16() for _ in range(L)]
    fa_dst = [torch.zeros(2, cap, BS, H, D, dtype=torch.bfloat16) for _ in range(L)]
    hnd_src = [
        torch.randn(2, cap, H, BS, D, generator=g).bfloat16().transpose(2, 3) for _ in range(L)
    ]
    hnd_dst = [
        torch.zeros(2, cap, H, BS, D, dtype=torch.bfloat16).transpose(2, 3) for _ in range(L)
    ]
    cross_src = torch.randn(cap, L, 2, BS, H, D, generator=g).bfloat16()
    cross_dst = torch.zeros(cap, L, 2, BS, H, D, dtype=torch.bfloat16)
    return {
        "fa": (fa_src, fa_dst, register_kv_caches(G, fa_src), register_kv_caches(G, fa_dst)),
        "hnd": (
            hnd_src,
            hnd_dst,
            register_kv_caches(GH, hnd_src, "flash_attn_hnd"),
            register_kv_caches(GH, hnd_dst, "flash_attn_hnd"),
        ),
        "cross": (
            cross_src,
            cross_dst,
            register_kv_caches(G, cross_src, cross_layer=True),
            register_kv_caches(G, cross_dst, cross_layer=True),
        ),
        "sb": _ids(nblocks, cap, 1),
        "db": _ids(nblocks, cap, 2),
    }


def _same(kind: str, src: Any, dst: Any, sb: list[int], db: list[int]) -> None:
    s, d = torch.as_tensor(sb), torch.as_tensor(db)
    if kind in ("fa", "hnd"):
        ok = all(torch.equal(x[:, s], y[:, d]) for x, y in zip(src, dst, strict=True))
    else:
        ok = torch.equal(src[s], dst[d])
    if not ok:
        raise SystemExit(f"{kind}: the handoff is not bit-exact")


def run(rounds: int, mib: int) -> dict[str, list[float]]:
    nblocks = max(1, mib // 2)
    st = _setup(nblocks)
    sb, db = st["sb"], st["db"]
    tokens = list(range(nblocks * BS))
    flat_src = torch.randn(nblocks * (2 << 20) // 2).bfloat16()
    flat_dst = torch.empty_like(flat_src)
    fa_src, fa_dst = st["fa"][0], st["fa"][1]
    s_idx, d_idx = torch.as_tensor(sb), torch.as_tensor(db)
    times: dict[str, list[float]] = {k: [] for k in ("copy_", "blocks", *PATHS)}

    kvs = GH  # kvown's pools as before (the canonical layout)
    p_src, p_dst = kvs.make_pools(nblocks), kvs.make_pools(nblocks)

    def via_pools(i: int) -> float:
        [t.zero_() for t in fa_dst]
        t = InProcessTransport()
        tx, rx = Sender(p_src, kvs, t, MODEL), Receiver(p_dst, kvs, t, MODEL)
        rid, n = f"via-{i}", len(tokens)
        t0 = time.perf_counter()
        own = p_src.alloc.allocate(rid, nblocks)
        for li, c in enumerate(fa_src):
            vllm_layer_to_blocks(c, sb, n, p_src, rid, own, li)
        got = handoff(tx, rx, rid, tokens, blocks=own, free_source=True).received.blocks
        for li, c in enumerate(fa_dst):
            blocks_to_vllm_layer(p_dst, got, n, c, db, li)
        p_dst.alloc.free(rid)
        dt = time.perf_counter() - t0
        _same("fa", fa_src, fa_dst, sb, db)
        return dt

    def api(path: str, i: int) -> float:
        if path == "via_pools":
            return via_pools(i)
        kind, layered = path.split("_")[0], path.endswith("layers")
        src, dst, ps, pd = st[kind]
        dst.zero_() if kind == "cross" else [t.zero_() for t in dst]
        t = InProcessTransport()
        g = GH if kind == "hnd" else G
        tx, rx = Sender(ps, g, t, MODEL), Receiver(pd, g, t, MODEL)
        rid = f"{path}-{i}"
        t0 = time.perf_counter()
        ps.adopt(rid, sb)
        handoff(tx, rx, rid, tokens, blocks=sb, dst_blocks=db, free_source=False, layered=layered)
        ps.release(rid), pd.release(rid)
        dt = time.perf_counter() - t0
        _same(kind, src, dst, sb, db)
        return dt

    for i in range(rounds + WARMUP):
        t0 = time.perf_counter()
        flat_dst.copy_(flat_src)
        times["copy_"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for x, y in zip(fa_src, fa_dst, strict=True):
            y.index_copy_(1, d_idx, x.index_select(1, s_idx))
        times["blocks"].append(time.perf_counter() - t0)
        for path in PATHS:
            times[path].append(api(path, i))
    return {k: v[WARMUP:] for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    times = run(args.rounds, args.mib)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "mib": args.mib,
        "rounds": args.rounds,
        "copy__ms": round(med["copy_"] * 1e3, 1),
        "ratios": {k: round(med[k] / med["copy_"], 2) for k in ("blocks", *PATHS)},
        "ms": {k: round(v * 1e3, 1) for k, v in med.items()},
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out["ratios"].items():
            print(f"{k:13s} {out['ms'][k]:9.1f} ms  {v:6.2f}x copy_ ({out['copy__ms']} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
