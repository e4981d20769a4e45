"""Shared setup of the library tests: two sides with real pools, a request's KV written."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import torch

from refimpl import pool as kvpool
from refimpl.api import KVGeometry, ModelIdentity, Receiver, Sender, write_kv
from refimpl.rankpools import RankPools
from refimpl.transport import InProcessTransport
from spec.manifest import RopeConfig

MODEL = ModelIdentity("lib-test", RopeConfig(10000.0, 8))
BASE = dict(num_layers=2, kv_heads=4, head_dim=8, block_size=4, dtype="float32")


def geo(**kw: object) -> KVGeometry:
    return KVGeometry(**{**BASE, **kw})  # type: ignore[arg-type]


@dataclass
class Pair:
    t: InProcessTransport
    src: RankPools
    dst: RankPools
    tx: Sender
    rx: Receiver


def pair(src: KVGeometry, dst: KVGeometry, *, src_cap: int = 16, dst_cap: int = 16) -> Pair:
    t = InProcessTransport()
    ps, pd = src.make_pools(src_cap), dst.make_pools(dst_cap)
    return Pair(t, ps, pd, Sender(ps, src, t, MODEL), Receiver(pd, dst, t, MODEL))


def prefill(
    p: Pair, rid: str, num_tokens: int, *, room_blocks: int = 0, seed: int = 0
) -> torch.Tensor:
    """Allocate and fill ``rid``'s blocks at the source; returns its KV [L, F, H, T, D]."""
    g = p.tx.geometry
    blocks = p.src.alloc.allocate(rid, g.blocks_for(num_tokens) + room_blocks)
    kv = torch.randn(
        (g.num_layers, 2, g.kv_heads, num_tokens, g.head_dim),
        generator=torch.Generator().manual_seed(seed),
    ).to(g.torch_dtype)
    write_kv(p.src, rid, blocks, [list(layer) for layer in kv])
    return kv


def held(pools: RankPools) -> dict[str, int]:
    """Blocks in each non-free status; ``{}`` when nothing is held."""
    pools.alloc.check_integrity()
    return {k: v for k, v in pools.alloc.counts().items() if k != "free" and v}


# ---------------------------------------------------------------- processes of one group
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    """Forked processes of one gloo group (``world`` ranks on loopback): rank r runs
    ``body(rank, conn)`` after ``init_process_group`` and sends its JSON report on its
    pipe (or ``ERROR ...``); ``with`` ends every process by its pid."""

    def __init__(self, world: int, body: Callable[[int, Any], Any], timeout_s: float) -> None:
        self.world, self.body, self.timeout_s, self.port = world, body, timeout_s, free_port()
        ctx = mp.get_context("fork")
        self.pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
        self.procs = [ctx.Process(target=self._child, args=(r,), daemon=True)
                      for r in range(world)]  # fmt: skip

    def _child(self, rank: int) -> None:
        import torch.distributed as dist

        conn = self.pipes[rank][1]
        try:
            torch.set_num_threads(1)
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{self.port}", rank=rank,
                world_size=self.world, timeout=timedelta(seconds=self.timeout_s),
            )  # fmt: skip
            conn.send(json.dumps(self.body(rank, conn)))
        except BaseException as e:
            conn.send(f"ERROR {type(e).__name__}: {e}")
            raise

    def __enter__(self) -> Procs:
        for p in self.procs:
            p.start()
        return self

    def recv(self, rank: int, timeout_s: float) -> str:
        """The next message of ``rank`` (an ``ERROR`` fails the test)."""
        assert self.pipes[rank][0].poll(timeout_s), f"process {rank} sent nothing"
        msg = self.pipes[rank][0].recv()
        assert not msg.startswith("ERROR"), f"process {rank}: {msg}"
        return str(msg)

    def report(self, rank: int, timeout_s: float) -> Any:
        return json.loads(self.recv(rank, timeout_s))

    def kill(self, rank: int) -> None:
        pid = self.procs[rank].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                p.join(3)
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)


def greedy(
    model: Any, logits: torch.Tensor, cache: Any, steps: int
) -> tuple[list[int], torch.Tensor]:
    """``steps`` greedy decode steps of a transformers model from ``logits`` over ``cache``:
    the tokens and each step's logits (to compare a handed-off cache with the model's own)."""
    tokens, rows = [], []
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(logits.argmax()))
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache)
            cache, logits = out.cache, out.logits[0, -1]
            rows.append(logits)
    return tokens, torch.stack(rows)


class Census:
    """Every ``KVPool`` built while it is on, and whether an attempt's staging built it
    (``refimpl.api.intake.accept``: a block-size change's one copy)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built: list[tuple[bool, weakref.ref[object]]] = []
        init = kvpool.KVPool.__init__

        def counted(pool: object, *a: object, **kw: object) -> None:
            init(pool, *a, **kw)  # type: ignore[arg-type]
            f, staging = sys._getframe(1), False
            while f is not None and not staging:
                staging = f.f_code.co_name == "accept" and f.f_code.co_filename.endswith(
                    "intake.py"
                )
                f = f.f_back  # type: ignore[assignment]
            self.built.append((staging, weakref.ref(pool)))

        monkeypatch.setattr(kvpool.KVPool, "__init__", counted)

    def kvown_pools(self) -> int:
        """Pools built but for staging."""
        return sum(not s for s, _ in self.built)

    def alive(self) -> int:
        gc.collect()
        return sum(r() is not None for _, r in self.built)


def quarantined_under_pending_writes(
    mutants: frozenset[str],
) -> tuple[Any, Pair, str, dict[str, Any]]:
    """An unrevocable pair whose request ``r`` the receiver quarantined (aborted before any
    write landed) while the Sender's three writes are pending, the last one overtaken by
    the next message: ``(transport, pair, channel, quarantined())``."""
    from refimpl.api import Receiver, Sender
    from refimpl.api.wire import channels
    from refimpl.transport import InProcessTransport

    t = InProcessTransport(revocable=False)
    g = geo()
    ps, pd = g.make_pools(16), g.make_pools(16)
    p = Pair(t, ps, pd, Sender(ps, g, t, MODEL, mutants=mutants), Receiver(pd, g, t, MODEL))
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")  # reserved, ready
    ch = channels("r").to_receiver
    t.inject(ch, "reorder", skip=2)  # the last write arrives after the next message
    p.tx.poll("r")  # every write posted
    p.rx.abort("r", "cancelled")  # before any landed: quarantined, nacked
    return t, p, ch, p.rx.quarantined()
