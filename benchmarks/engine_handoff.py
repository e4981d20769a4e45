"""The seed's 64 MiB handoff through the reference engine, against a raw ``copy_``.

Not a ``benchmarks/datapath.py`` HANDOFFS entry: that harness times one call per round,
and through the engine's protocol a request is handed off once in its life, so every
round needs a freshly admitted and prefilled request. Here that setup (a new engine,
``PrefillAdmit``, ``PrefillRun``) runs outside the timer; the timed part is the protocol,
every action of it on real bytes:

    PrefillFreeze (pin, xxh3 per block, manifest) -> DecodeReserve (validate manifest,
    reserve) -> PrefillRecvReady -> PrefillSendChunk x (blocks + 1) -> DecodeReceiveChunk
    (verify, install) x blocks -> DecodeReceiveDone -> DecodeValidate (every block
    re-hashed end to end) -> DecodeCommit -> PrefillRelease

The seed's KV (L=16, H_kv=8, T=1024, D=128, FP16) is 4 blocks of 256 tokens (the spec's
message encoding caps a request at 4 blocks). The ratio is raw time / engine time, from
medians of interleaved rounds. The engine hashes each block four times (freeze, the
wire's lookup, the install check, the end-to-end check), so expect well below 1.

    python benchmarks/engine_handoff.py [--json] [--rounds N]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refimpl.engine import Engine  # noqa: E402
from spec.config import Config  # noqa: E402

SEED_64MIB = Config(
    name="seed_64mib", doc="the seed's 64 MiB KV, one request", blocks=4, cap_p=4, cap_d=4
)
GEOMETRY = {"block_size": 256, "head_dim": 128, "layers": 16, "kv_heads": 8}


def prepared(seed: int) -> Engine:
    """A fresh engine whose one request is prefilled and ready to hand off (untimed)."""
    e = Engine(SEED_64MIB, seed=seed, decode_layout="heads_major", **GEOMETRY)  # type: ignore[arg-type]
    e.PrefillAdmit(0)
    e.PrefillRun(0)
    return e


def handoff(e: Engine) -> None:
    e.PrefillFreeze(0)
    e.DecodeReserve(0, "Handoff", 1, 0)
    e.PrefillRecvReady(0, "Ready", 1, 0)
    for _ in range(e.n + 1):
        e.PrefillSendChunk(0)
    for k in range(e.n):
        e.DecodeReceiveChunk(0, "Chunk", 1, k)
    e.DecodeReceiveDone(0, "RankDone", 1, 0)
    e.DecodeValidate(0)
    e.DecodeCommit(0)
    e.PrefillRelease(0, "Ack", 1, 0)


def timed(cuda: bool, fn: Callable[[], object]) -> float:
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def run(rounds: int) -> dict[str, float]:
    copy_ms, engine_ms = [], []
    raw: torch.Tensor | None = None
    for r in range(rounds + 2):  # two warm-up rounds
        e = prepared(r)
        src = e.P.pools[0].kv
        dst = raw = torch.zeros_like(src) if raw is None else raw  # touched: no page faults
        cuda = src.device.type == "cuda"
        c = timed(cuda, lambda: dst.copy_(src))  # noqa: B023 - called at once
        h = timed(cuda, lambda: handoff(e))  # noqa: B023
        if r >= 2:
            copy_ms.append(c)
            engine_ms.append(h)
        assert e.damaged() == [] and torch.equal(e.replica(0, "d"), e.truth[0])
        e.check_integrity()
    copy, eng = statistics.median(copy_ms), statistics.median(engine_ms)
    return {
        "engine_handoff_over_copy": copy / eng,
        "copy_ms": copy,
        "engine_ms": eng,
        "payload_bytes": SEED_64MIB.blocks * prepared_block_bytes(),
    }


def prepared_block_bytes() -> int:
    g = GEOMETRY
    return 2 * g["layers"] * g["kv_heads"] * g["block_size"] * g["head_dim"] * 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with torch.inference_mode():
        out = run(args.rounds)
    if args.json:
        print(json.dumps(out))
        return
    print(f"payload {out['payload_bytes'] / 2**20:.0f} MiB, {args.rounds} rounds (medians)")
    for k, v in out.items():
        print(f"{k:<26}{v:>10.3f}")


if __name__ == "__main__":
    main()
