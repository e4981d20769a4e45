"""TP 2 prefill -> TP 1 decode, one OS process per rank, layer by layer, over gloo.

Three processes join one torch.distributed group (gloo on CPU): ranks 0 and 1 are the
prefill side's TP ranks, rank 2 the decode side. Each prefill rank runs the tiny model
(``refimpl.model``, the same seed everywhere) and, as each layer's K/V is written, keeps
only its own heads in its own pools (``KVGeometry.make_rank_pools``) and ships that layer
(``Sender(..., rank=r)``, ``offer(..., layers=L)``, ``send_layer``: a KV connector's
``save_kv_layer``). Rank 0 also sends the first token. The decode side (``Receiver``, block
size 8 against the prefill side's 16) waits for each layer (``layer_ready``: a connector's
``wait_for_layer_load``), then for the commit, rebuilds the KV from its own blocks and
decodes greedily. Its tokens and logits must equal one unbroken process's run.

Only the public API and ``refimpl.transport_dist.DistTransport`` are used. The launcher
starts every process itself (forked on Linux) and ends each by its pid after a bounded
wait; ``--worker RANK PORT TIMEOUT_S`` runs one rank alone (e.g. one per host).

    python examples/dist_layer_handoff.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from refimpl import KVGeometry, ModelIdentity, Receiver, Sender, State, read_kv, write_kv_layer
from refimpl.model import ContiguousKV, TinyConfig, TinyDecoder, decode, generate

PROMPT, STEPS, SEED, RID = 37, 8, 0, "req-1"
SRC_TP, DECODE = 2, 2  # prefill ranks 0..1, the decode side is group rank 2
CFG = TinyConfig(layers=3, q_heads=8, kv_heads=4, head_dim=8, dtype="float32")
IDENTITY = ModelIdentity("tiny-seed0", CFG.rope)
SRC = KVGeometry(CFG.layers, CFG.kv_heads, CFG.head_dim, 16, "float32", tp=SRC_TP)
DST = KVGeometry(CFG.layers, CFG.kv_heads, CFG.head_dim, 8, "float32")


def prompt() -> torch.Tensor:
    return torch.randint(0, CFG.vocab, (PROMPT,), generator=torch.Generator().manual_seed(1))


class _Streaming(ContiguousKV):
    """The model's own KV, plus: as each layer is written, this rank's heads go into its
    pools and out on the wire (the shape of ``save_kv_layer``)."""

    def __init__(self, tx: Sender, blocks: list[int]) -> None:
        super().__init__(CFG)
        self.tx, self.blocks = tx, blocks

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        super().write(layer, start, k, v)
        r, n = self.tx.rank or 0, SRC.kv_heads_per_rank
        h = slice(r * n, (r + 1) * n)
        write_kv_layer(self.tx.pools, RID, self.blocks, layer, [k[h], v[h]])
        self.tx.send_layer(RID, layer)
        self.tx.poll(RID)


def prefill_rank(rank: int, t: Any, deadline: float) -> dict[str, Any]:
    pools = SRC.make_rank_pools(rank, 8)
    tx = Sender(pools, SRC, t, IDENTITY, rank=rank)
    ids = prompt()
    blocks = pools.alloc.allocate(RID, SRC.blocks_for(PROMPT))
    tx.offer(RID, ids.tolist(), blocks=blocks, layers=CFG.layers, free_source=True, epoch=1)
    logits = TinyDecoder(CFG, SEED).prefill(ids, _Streaming(tx, blocks))
    if rank == 0:  # the first token goes with the KV, as a P/D router's response does
        t.send(f"tok:{RID}>rx", {"first": int(logits[-1].argmax())})
    while not tx.state(RID).final and time.monotonic() < deadline:
        tx.poll(RID)
        time.sleep(0.001)
    if not tx.state(RID).final:
        tx.abort(RID, "timeout")
    return {"role": f"prefill{rank}", "state": tx.state(RID).value, "held": len(tx.held())}


def decode_side(t: Any, deadline: float) -> dict[str, Any]:
    pools = DST.make_pools(16)
    rx = Receiver(pools, DST, t, IDENTITY)
    rx.expect(RID, decode_room=STEPS)
    order = []  # the layers in the order they were seen ready
    for layer in range(CFG.layers):  # wait_for_layer_load, one layer at a time
        while not rx.layer_ready(RID, layer) and time.monotonic() < deadline:
            if rx.state(RID).final:
                break
            rx.poll(RID)
            time.sleep(0.001)
        order.append((layer, rx.state(RID).value))
    while not rx.state(RID).final and time.monotonic() < deadline:
        rx.poll(RID)
        time.sleep(0.001)
    if rx.state(RID) is not State.DONE:
        rx.abort(RID, "timeout")
        return {"role": "decode", "state": rx.state(RID).value, "error": str(rx.error(RID))}
    first: list[Any] = []
    while not first and time.monotonic() < deadline:
        first = t.poll(f"tok:{RID}>rx")
    got = rx.result(RID)  # owned here only now, at commit
    kv = read_kv(pools, got.blocks, PROMPT)  # [L, 2, H, T, D]
    store = ContiguousKV(CFG)
    for layer in range(CFG.layers):
        store.write(layer, 0, kv[layer, 0].contiguous(), kv[layer, 1].contiguous())
    model = TinyDecoder(CFG, SEED)
    rows, tokens = decode(model, int(first[0][0]["first"]), PROMPT, STEPS, store)
    ref = generate(model, prompt(), STEPS)  # one process, unbroken, unpaged
    return {
        "role": "decode",
        "state": rx.state(RID).value,
        "layers_seen": order,
        "tokens": list(tokens),
        "tokens_equal": tokens == ref.tokens,
        "logits_equal": bool(torch.equal(rows, ref.decode_logits)),
        "blocks": len(got.blocks),
        "checks": rx.checks(RID),
    }


def worker(rank: int, port: int, timeout_s: float) -> int:
    import torch.distributed as dist

    from refimpl.transport_dist import DistTransport, handoff_route

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=SRC_TP + 1,
        timeout=timedelta(seconds=timeout_s),
    )
    t = DistTransport(handoff_route(DECODE, list(range(SRC_TP))))
    deadline = time.monotonic() + timeout_s
    try:
        out = decode_side(t, deadline) if rank == DECODE else prefill_rank(rank, t, deadline)
        print(json.dumps(out), flush=True)
    finally:
        t.close(timeout_s=timeout_s)
        dist.destroy_process_group()
    return 0


def _child(rank: int, port: int, timeout_s: float, conn: Any) -> None:
    """A forked worker: its report goes back through ``conn`` (exit 0 once sent)."""
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            worker(rank, port, timeout_s)
        conn.send(buf.getvalue())
    except BaseException as e:  # report the failure, then exit non-zero
        conn.send(f"ERROR {type(e).__name__}: {e}")
        raise


def launch(timeout_s: float = 90.0) -> list[dict[str, Any]]:
    """Start the three processes, wait (bounded), end each by its pid; their reports.

    Forked from this process on Linux (torch is imported once: seconds, not tens of
    seconds under load), else started afresh (``spawn``)."""
    import multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(SRC_TP + 1)]
    procs = [
        ctx.Process(target=_child, args=(r, port, timeout_s, pipes[r][1]), daemon=True)
        for r in range(SRC_TP + 1)
    ]
    end, reports = time.monotonic() + timeout_s + 15, []
    try:
        for p in procs:
            p.start()
        for r, p in enumerate(procs):
            recv = pipes[r][0]
            if not recv.poll(max(0.0, end - time.monotonic())):
                raise TimeoutError(f"worker {r} (pid {p.pid}) sent no report in time")
            out = recv.recv()
            if out.startswith("ERROR"):
                raise RuntimeError(f"worker {r} (pid {p.pid}): {out[:2000]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
            p.join(max(0.0, end - time.monotonic()))
    finally:
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
    return reports


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "TIMEOUT_S"))
    a = ap.parse_args(argv)
    if a.worker:
        return worker(int(a.worker[0]), int(a.worker[1]), float(a.worker[2]))
    reports = launch()
    dec = next(r for r in reports if r["role"] == "decode")
    ok = dec.get("tokens_equal") and dec.get("logits_equal")
    ok = ok and all(r["state"] == "done" for r in reports)
    if a.json:
        print(json.dumps(reports))
    else:
        for r in reports:
            print(r)
        print("OK: identical tokens and logits" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
