"""The public API's data path against raw copies, side by side in one run (issue #30).

256 MiB of KV: 32 layers, 8 KV heads, head dim 128, bfloat16, 2,048 tokens in blocks of
16 (128 blocks of 2 MiB). Each figure is a path's median time over the raw operation's
median, from interleaved rounds (drift on a busy machine hits both alike); lower is
better, the goal is "at most". ``ratio`` is of medians (wall), ``ratio_min`` of minima
(the least-disturbed round of each); in one process each path's CPU time
(``time.process_time``) is timed too, as ``cpu_<path>`` over ``cpu_copy``: on a machine
shared with other jobs it counts only this process's work (``met_cpu_min``: the goals
on the minima of CPU time):

    in one process (``InProcessTransport``):
      whole     ``handoff()`` pool -> pool             vs ``copy_`` of the same bytes (1.25)
      layers    ``handoff(..., layered=True)``          vs ``copy_``                   (1.5)
    across two OS processes (gloo, loopback; ``DistTransport`` on its own group):
      dist      ``Sender``/``Receiver`` whole-block     vs one ``dist.send``/``recv``   (1.3)
      dist_l    ``offer(layers=L)`` + ``send_layer``    vs one send per layer           (1.3)

A whole-block offer is given the writer's checksums (``offer(checksums=...)``: prefill
takes them as it writes the blocks, outside the timer as the write is); a streamed one
hashes each chunk as ``send_layer`` copies it. Every timed handoff is checked bit-exact
against the source (outside the timer); a first
round of every path is run untimed (``WARMUP``: pools, buffers and connections warm), and
a full garbage collection runs before every timed operation, outside the timer (as
``timeit`` keeps the collector out: one landed in the first timed round, 250 ms). The
two-process figures time the sender from a barrier to the receiver's ack; the raw ones
from the same barrier to a one-element reply after the last ``recv``.

``--before`` also times each API path with the receiver's old order (each chunk hashed,
then copied: ``refimpl.api.install.HASH_AS_LANDED = False``), interleaved in the same
rounds, as ``<path>_before``, so both orders compare in one run on a busy machine.
``--floors`` also times the raw floors (``floors``: no API, no message), as ``f_*``.

    python benchmarks/api_handoff.py [--rounds 5] [--json] [--skip-dist] [--before] [--floors]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import signal
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refimpl import KVGeometry, ModelIdentity, Receiver, Sender, State, handoff  # noqa: E402
from refimpl.api import install  # noqa: E402
from refimpl.checksum import block_checksum  # noqa: E402
from refimpl.transport import InProcessTransport  # noqa: E402
from spec.manifest import RopeConfig  # noqa: E402

# isort: split
import torch  # noqa: E402

G = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, block_size=16, dtype="bfloat16")
TOKENS = 2048
NBLOCKS = G.blocks_for(TOKENS)
MODEL = ModelIdentity("bench", RopeConfig(theta=10000.0, rotary_dim=128))
POLL_S = 0.0002  # an engine's loop between polls (a spin would starve the transport's threads)
WARMUP = 1  # untimed first rounds: every path (the raw ones too) starts warm
GOALS = {"whole": 1.25, "layers": 1.5, "dist": 1.3, "dist_l": 1.3}


def _fill(pools: Any, rid: str) -> tuple[list[int], list[str]]:
    """Prefill's write of the request's blocks, and the checksums it takes as it writes
    them (``offer(checksums=...)``; outside the timers, as the write itself)."""
    blocks = pools.alloc.allocate(rid, NBLOCKS)
    kv = pools.pools[0].kv
    idx = torch.as_tensor(blocks)
    kv[idx] = torch.randn(kv[idx].shape, generator=torch.Generator().manual_seed(7)).to(kv.dtype)
    return blocks, [block_checksum(kv[b]) for b in blocks]


def _same(src: Any, sb: list[int], dst: Any, db: tuple[int, ...]) -> None:
    a, b = src.pools[0].kv[torch.as_tensor(sb)], dst.pools[0].kv[torch.as_tensor(db[:NBLOCKS])]
    assert torch.equal(a, b), "not bit-exact"


def _orders(before: bool) -> tuple[tuple[str, bool], ...]:
    """(suffix, the receiver hashes as landed) of each order timed."""
    return (("", True), ("_before", False)) if before else (("", True),)


def in_process(rounds: int, before: bool = False) -> dict[str, list[float]]:
    src, dst = G.make_pools(NBLOCKS), G.make_pools(NBLOCKS)
    t = InProcessTransport()
    tx, rx = Sender(src, G, t, MODEL), Receiver(dst, G, t, MODEL)
    a, b = torch.empty_like(src.pools[0].kv), torch.empty_like(src.pools[0].kv)
    a.copy_(torch.randn(a.shape).to(a.dtype))
    b.copy_(a)  # both touched once: the copy_ is warm, as the pools are
    times: dict[str, list[float]] = {"copy": []}
    for i in range(rounds + WARMUP):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        b.copy_(a)
        times["copy"].append(time.perf_counter() - t0)
        times.setdefault("cpu_copy", []).append(time.process_time() - c0)
        for (kind, layered), (suffix, landed) in itertools.product(
            (("whole", False), ("layers", True)), _orders(before)
        ):
            install.HASH_AS_LANDED, name = landed, kind + suffix
            rid = f"{name}-{i}"
            blocks, sums = _fill(src, rid)
            gc.collect()  # a full collection (250 ms here) is not the data path's: as timeit
            t0, c0 = time.perf_counter(), time.process_time()
            got = handoff(tx, rx, rid, range(TOKENS), blocks=blocks, layered=layered,
                          free_source=False, checksums=None if layered else sums)  # fmt: skip
            times.setdefault(name, []).append(time.perf_counter() - t0)
            times.setdefault("cpu_" + name, []).append(time.process_time() - c0)
            _same(src, blocks, dst, got.received.blocks)
            src.alloc.free(rid)
            dst.alloc.free(rid)
            tx.forget(rid)
            rx.forget(rid)
    install.HASH_AS_LANDED = True
    return {k: v[WARMUP:] for k, v in times.items()}


def floors(rounds: int) -> dict[str, list[float]]:
    """The data path's floors on this machine, pool to pool, one thread: ``copy_`` of the
    256 MiB; each 2 MiB block hashed then copied (the receiver's old order); copied then
    hashed from cache (``copy_hashed``, its order now); and layer by layer, each block's
    layer piece copied straight from the source pool into the destination's and hashed
    there (one copy and one hash: what a send_layer that writes into the receiver's
    reserved blocks would cost, without any message or check around it)."""
    from refimpl.checksum import byte_view, bytes_checksum, hasher
    from refimpl.memory.views import _span, copy_hashed, landing, rows

    src, dst = G.make_pools(NBLOCKS).pools[0], G.make_pools(NBLOCKS).pools[0]
    src.kv.copy_(torch.randn(src.kv.shape).to(src.kv.dtype))
    dst.kv.copy_(src.kv)  # touched once: warm
    blocks = list(range(NBLOCKS))
    payload, span = byte_view(src.kv), landing(dst.kv)
    assert span is not None
    per = payload.nbytes // NBLOCKS

    def hash_then_copy() -> None:
        for b in blocks:
            piece = payload[b * per : (b + 1) * per]
            bytes_checksum(piece)
            span[0][b * per : (b + 1) * per] = piece

    def one_copy_layers() -> None:
        for layer in range(G.num_layers):
            s_raw, d_raw = rows(src.layer(layer)), rows(dst.layer(layer))
            assert s_raw is not None and d_raw is not None
            s, d, stride, n = _span(s_raw), _span(d_raw), s_raw.stride(0), s_raw.shape[1]
            h = hasher()
            for b in blocks:
                d[b * stride : b * stride + n] = s[b * stride : b * stride + n]
                h.update(d[b * stride : b * stride + n])
            h.hexdigest()

    ops = {
        "f_copy": lambda: dst.kv.copy_(src.kv),
        "f_hash_then_copy": hash_then_copy,
        "f_copy_hashed": lambda: copy_hashed(span, blocks, payload),
        "f_one_copy_layers": one_copy_layers,
    }
    times: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(rounds + WARMUP):  # (the cpu_f_* lists are made on first use)
        for name, op in ops.items():
            gc.collect()
            t0, c0 = time.perf_counter(), time.process_time()
            op()
            times[name].append(time.perf_counter() - t0)
            times.setdefault("cpu_" + name, []).append(time.process_time() - c0)
    return {k: v[WARMUP:] for k, v in times.items()}


def _dist_worker(rank: int, port: int, rounds: int, out: str, before: bool) -> None:
    import torch.distributed as dist

    from refimpl.transport_dist import DistTransport, handoff_route

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=300))  # fmt: skip
    group = dist.new_group([0, 1])  # the transport's frames apart from the raw sends
    t = DistTransport(handoff_route(1, [0]), group=group)
    pools = G.make_pools(NBLOCKS)
    one = torch.zeros(1)
    raw = torch.empty(NBLOCKS * G.rank_pool_geometry().block_bytes, dtype=torch.uint8)
    times: dict[str, list[float]] = {"raw": [], "raw_l": []}
    layer_bytes = raw.numel() // G.num_layers

    def raw_send(per_layer: bool) -> None:
        parts = raw.split(layer_bytes) if per_layer else [raw]
        if rank == 0:
            for p in parts:
                dist.send(p, 1)
            dist.recv(one, 1)
        else:
            for p in parts:
                dist.recv(p, 0)
            dist.send(one, 0)

    # one Sender (each kind) and one Receiver per process, as an engine keeps them: their
    # reused buffers are warm after the first round (a fresh 256 MiB costs a page fault
    # per page: more than the copy itself)
    txs = {lay: Sender(pools, G, t, MODEL, rank=0 if lay else None) for lay in (False, True)}
    rx = Receiver(pools, G, t, MODEL)

    def api(rid: str, layered: bool, suffix: str) -> None:
        if rank == 0:
            tx = txs[layered]
            blocks, sums = _fill(pools, rid)
            gc.collect()
            dist.barrier()
            t0 = time.perf_counter()
            tx.offer(rid, range(TOKENS), blocks=blocks, epoch=1,
                     layers=G.num_layers if layered else None,
                     checksums=None if layered else sums)  # fmt: skip
            for layer in range(G.num_layers if layered else 0):
                tx.send_layer(rid, layer)
                tx.poll(rid)
            while not tx.state(rid).final:
                tx.poll(rid)
                time.sleep(POLL_S)
            took = time.perf_counter() - t0
            assert tx.state(rid) is State.DONE, tx.reasons(rid)
            times.setdefault(("dist_l" if layered else "dist") + suffix, []).append(took)
            digest = pools.pools[0].kv[torch.as_tensor(blocks)].float().sum()
            dist.send(digest.reshape(1), 1)
            pools.alloc.free(rid)
            tx.forget(rid)
        else:
            rx.expect(rid)
            gc.collect()
            dist.barrier()
            while not rx.state(rid).final:
                rx.poll(rid)
                time.sleep(POLL_S)
            got = rx.result(rid)  # raises the failure, if any
            mine = pools.pools[0].kv[torch.as_tensor(got.blocks)].float().sum().reshape(1)
            theirs = torch.zeros(1)
            dist.recv(theirs, 0)
            assert torch.equal(mine, theirs), "not bit-exact"
            pools.alloc.free(rid)
            rx.forget(rid)

    for i in range(rounds + WARMUP):
        for name, per_layer in (("raw", False), ("raw_l", True)):
            gc.collect()
            dist.barrier()
            t0 = time.perf_counter()
            raw_send(per_layer)
            times[name].append(time.perf_counter() - t0)
        for layered, (suffix, landed) in itertools.product((False, True), _orders(before)):
            install.HASH_AS_LANDED = landed  # the receiver's (rank 1's) order
            api(f"{'l' if layered else 'w'}{suffix}{i}", layered, suffix)
    if rank == 0:
        Path(out).write_text(json.dumps({k: v[WARMUP:] for k, v in times.items()}))
    t.close()
    dist.destroy_process_group()


def two_processes(rounds: int, before: bool = False) -> dict[str, list[float]]:
    import multiprocessing as mp
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(prefix="kvown-bench-"), "dist.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_dist_worker, args=(r, port, rounds, out, before)) for r in (0, 1)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(900)
    finally:
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a worker failed: exit codes {[p.exitcode for p in procs]}")
    return json.loads(Path(out).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-dist", action="store_true", help="only the in-process figures")
    ap.add_argument("--before", action="store_true", help="also the receiver's old order")
    ap.add_argument("--floors", action="store_true", help="also the raw floors (no API)")
    ns = ap.parse_args()
    torch.set_num_threads(1)
    load = [round(x, 2) for x in os.getloadavg()]
    times = in_process(ns.rounds, ns.before)
    if ns.floors:
        times.update(floors(ns.rounds))
    if not ns.skip_dist:
        times.update(two_processes(ns.rounds, ns.before))
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    base = {"whole": "copy", "layers": "copy", "dist": "raw", "dist_l": "raw_l"}
    base.update({f: "f_copy" for f in med if f.startswith("f_") and f != "f_copy"})
    base.update({"cpu_" + k: "cpu_" + b for k, b in base.items() if k in GOALS or k[0] == "f"})
    base = {k: b for k, b in base.items() if b in med}  # (cpu_: in-process paths only)

    def ratio_of(of: dict[str, float]) -> dict[str, float]:
        return {
            k + sfx: of[k + sfx] / of[b] for k, b in base.items() for sfx in ("", "_before")
            if k + sfx in of
        }  # fmt: skip

    ratios, lows = ratio_of(med), ratio_of(low)
    report = {
        "mib": NBLOCKS * G.rank_pool_geometry().block_bytes / 2**20,
        "rounds": ns.rounds,
        "load_before": load,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "median_ms": {k: round(v * 1e3, 1) for k, v in med.items()},
        "rounds_ms": {k: [round(x * 1e3, 1) for x in v] for k, v in times.items()},
        "ratio": {k: round(v, 2) for k, v in ratios.items()},
        "ratio_min": {k: round(v, 2) for k, v in lows.items()},
        "goal": {k: GOALS[k.removesuffix("_before")] for k in ratios if k in GOALS},
        "met": {k: ratios[k] <= GOALS[k] for k in ratios if k in GOALS},
        "met_cpu_min": {k: lows["cpu_" + k] <= GOALS[k] for k in GOALS if "cpu_" + k in lows},
    }
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        for k, v in report.items():
            print(f"{k:12} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
