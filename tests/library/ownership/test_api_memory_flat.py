"""Flat memory in a long-running process (issue #30, "What to build" 5), measured: the
same process serves requests one after another, one in three cancelled (by either side,
at varying points), through a Sender/Receiver pair and a rank group (two
``RankSender``s, two ``RankReceiver``s), each request forgotten on every end once it
ended. The bytes Python holds (``tracemalloc``, after a collection) and the number of
objects the collector tracks are read after the first tenth of the requests and after
all of them: what the last nine tenths added must be a constant, not a per-request
amount (the bound is far below one request's records times the requests served). The
suite serves 200 requests (tracemalloc slows every allocation); the nightly job 10,000."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch

from refimpl import KVGeometry, Receiver, Sender, write_kv, write_kv_layer
from refimpl.api.ranks import Epochs, RankReceiver, RankSender, sub_id
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import MODEL

G = KVGeometry(num_layers=2, kv_heads=2, head_dim=8, block_size=2, dtype="float32")
G2 = G.with_(tp=2)
KV = torch.arange(2 * 2 * 3 * 8, dtype=torch.float32).reshape(2, 2, 1, 3, 8)


class Served:
    def __init__(self) -> None:
        self.t = InProcessTransport(max_fences=64)
        self.src, self.dst = G.make_pools(8), G.make_pools(8)
        self.tx, self.rx = Sender(self.src, G, self.t, MODEL), Receiver(self.dst, G, self.t, MODEL)
        self.epochs = Epochs()
        self.sp = [G2.make_rank_pools(r, 8) for r in range(2)]
        self.dp = [G2.make_rank_pools(d, 8) for d in range(2)]
        self.gtx = [RankSender(p, G2, self.t, MODEL, rank=r, dst_tp=2, epochs=self.epochs)
                    for r, p in enumerate(self.sp)]  # fmt: skip
        self.grx = [RankReceiver(p, G2, self.t, MODEL, rank=d, src_tp=2)
                    for d, p in enumerate(self.dp)]  # fmt: skip
        self.ends: dict[str, int] = {}

    def pair(self, i: int) -> None:
        rid, streamed = f"p{i}", i % 2 == 1
        blocks = self.src.alloc.allocate(rid, 2)
        write_kv(self.src, rid, blocks, [[torch.cat([KV[0, 0]] * 2)] * 2] * 2)
        self.rx.expect(rid, decode_room=1)
        self.tx.offer(rid, [0, 1, 2], blocks=blocks, layers=2 if streamed else None)
        for step in range(30):
            if streamed and step < 2:
                self.tx.send_layer(rid, step)
            if i % 3 == 0 and step == 1:
                (self.rx if i % 2 else self.tx).abort(rid, "cancelled")
            moved = self.rx.poll(rid) + self.tx.poll(rid)
            if self.tx.state(rid).final and self.rx.state(rid).final:
                break
            if not moved and step > 3:
                self.rx.abort(rid, "timeout")
                self.tx.abort(rid, "timeout")
        self.rx.poll(rid)
        assert self.tx.state(rid).final and self.rx.state(rid).final, rid
        self._count(self.rx.state(rid).value)
        for pools in (self.src, self.dst):
            if pools.alloc.blocks_of(rid):
                pools.alloc.free(rid)
        self.tx.forget(rid)
        self.rx.forget(rid)

    def group(self, i: int) -> None:
        rid = f"g{i}"
        self.epochs.open(rid)
        blocks = [p.alloc.allocate(rid, 2) for p in self.sp]
        for rx in self.grx:
            rx.expect(rid)
        for tx, b in zip(self.gtx, blocks, strict=True):
            tx.offer(rid, [0, 1, 2], blocks=b)
        for step in range(30):
            if step < 2:
                for p, tx, b in zip(self.sp, self.gtx, blocks, strict=True):
                    write_kv_layer(p, rid, b, step, [KV[step, 0], KV[step, 1]])
                    tx.send_layer(rid, step)
            if i % 3 == 0 and step == 1:
                ([*self.gtx, *self.grx][i % 4]).abort(rid, "cancelled")
            for x in [*self.grx, *self.gtx]:
                x.poll(rid)
            if all(x.state(rid).final for x in [*self.grx, *self.gtx]):
                break
        assert all(x.state(rid).final for x in [*self.grx, *self.gtx]), rid
        self._count("group " + self.grx[0].state(rid).value)
        for d, (rx, p) in enumerate(zip(self.grx, self.dp, strict=True)):
            if rx.ready(rid):
                p.alloc.free(sub_id(rid, d))
            rx.forget(rid)
        for tx, p in zip(self.gtx, self.sp, strict=True):
            p.alloc.free(rid)
            tx.forget(rid)

    def _count(self, end: str) -> None:
        self.ends[end] = self.ends.get(end, 0) + 1

    def blocks_held(self) -> int:
        pools = [self.src, self.dst, *self.sp, *self.dp]
        return sum(len(p.alloc.holders()) for p in pools)


def _measure() -> tuple[int, int]:
    gc.collect()
    return tracemalloc.get_traced_memory()[0], len(gc.get_objects())


def _check(n: int) -> None:
    s = Served()
    tracemalloc.start()
    try:
        for i in range(n):
            s.pair(i)
            s.group(i)
            if i == n // 10 - 1:
                first = _measure()
        last = _measure()
    finally:
        tracemalloc.stop()
    grew, objs = last[0] - first[0], last[1] - first[1]
    print(f"{n} requests x 2: +{grew} bytes, +{objs} objects after the first {n // 10}; {s.ends}")
    assert s.ends.get("done", 0) and s.ends.get("aborted", 0) and s.ends.get("group done", 0)
    assert s.ends.get("group aborted", 0) and s.blocks_held() == 0
    # One request's records (attempt, manifest, stream, group) are several KiB and tens
    # of objects: 0.9 * n of them kept would be megabytes and tens of thousands.
    assert grew < 64 * 1024, f"{grew} bytes more after {n} requests than after {n // 10}"
    assert objs < 500, f"{objs} objects more after {n} requests than after {n // 10}"


def test_200_requests_with_cancels_leave_memory_flat() -> None:
    _check(200)


@pytest.mark.nightly
def test_10000_requests_with_cancels_leave_memory_flat() -> None:
    _check(10_000)
