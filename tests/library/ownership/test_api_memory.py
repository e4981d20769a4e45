"""A long-running process stays bounded (issue #30, "What to build" 5): requests served
one after another in process, with cancels from either side, lost chunks ending in a
timeout, streamed and whole-block offers, each forgotten on both ends once it ended.
What Sender, Receiver and transport keep per request is counted (structure sizes, not
timing): it returns to 0 after each request (the fences stay under their cap). The
suite serves 600 requests; the nightly job 10,000."""

from __future__ import annotations

import pytest
import torch

from refimpl import KVGeometry, Receiver, Sender, State, channels, write_kv
from refimpl.transport import Fault, InProcessTransport
from tests.library.lib_helpers import MODEL

G = KVGeometry(num_layers=2, kv_heads=1, head_dim=8, block_size=2, dtype="float32")
FENCES = 32


def _serve(n: int) -> dict[str, object]:
    t = InProcessTransport(max_fences=FENCES)
    src, dst = G.make_pools(8), G.make_pools(8)
    tx, rx = Sender(src, G, t, MODEL), Receiver(dst, G, t, MODEL)
    ends: dict[str, int] = {}
    worst: dict[str, int] = {}
    for i in range(n):
        rid, streamed = f"req-{i}", i % 2 == 1
        blocks = src.alloc.allocate(rid, 2)
        write_kv(src, rid, blocks, [[torch.full((1, 3, 8), float(i))] * 2] * 2)
        rx.expect(rid, decode_room=1)
        if i % 7 == 3:
            t.inject(channels(rid).to_receiver, Fault.LOSE, skip=1)  # a chunk lost
        tx.offer(rid, [0, 1, 2], blocks=blocks, layers=2 if streamed else None)
        idle = 0
        for step in range(40):
            if streamed and step < 2:
                tx.send_layer(rid, step)
            if i % 3 == 0 and step == 1:
                rx.abort(rid, "client went away")  # the receiver cancels mid-transfer
            if i % 5 == 0 and step == 2:
                tx.abort(rid, "router cancelled")  # the sender cancels
            moved = rx.poll(rid) + tx.poll(rid)
            idle = 0 if moved else idle + 1
            if tx.state(rid).final and rx.state(rid).final:
                break
            if idle > 2:
                rx.abort(rid, "timeout")
                tx.abort(rid, "timeout")
        rx.poll(rid)
        tx.poll(rid)
        assert tx.state(rid).final and rx.state(rid).final, (rid, tx.state(rid), rx.state(rid))
        ends[rx.state(rid).value] = ends.get(rx.state(rid).value, 0) + 1
        if rx.state(rid) is State.DONE:
            dst.alloc.free(rid)  # decode finished with it
        if src.alloc.blocks_of(rid):
            src.alloc.free(rid)
        tx.forget(rid)
        rx.forget(rid)
        kept = {
            "sender": tx.records(),
            **{f"receiver_{k}": v for k, v in rx.records().items()},
            **{f"transport_{k}": v for k, v in t.sizes().items()},
            "src_blocks": 8 - src.alloc.num_free,
            "dst_blocks": 8 - dst.alloc.num_free,
        }
        for k, v in kept.items():
            worst[k] = max(worst.get(k, 0), v)
        assert {k: v for k, v in kept.items() if k != "transport_fences" and v} == {}, (rid, kept)
    return {"ends": ends, "worst": worst}


def _check(n: int) -> None:
    out = _serve(n)
    ends, worst = out["ends"], out["worst"]
    assert isinstance(ends, dict) and isinstance(worst, dict)
    assert sum(ends.values()) == n and ends.get("done", 0) > 0 and ends.get("aborted", 0) > 0
    assert worst["transport_fences"] == FENCES  # bounded by the cap, not by n
    assert {k: v for k, v in worst.items() if k != "transport_fences" and v} == {}


def test_600_requests_with_cancels_keep_nothing_per_request() -> None:
    _check(600)


@pytest.mark.nightly
def test_10000_requests_with_cancels_keep_nothing_per_request() -> None:
    _check(10_000)
