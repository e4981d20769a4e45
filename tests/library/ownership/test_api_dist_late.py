"""Two OS processes over ``DistTransport`` (gloo): a cancelled request's late chunks are
dropped on arrival, not kept (issue #30 bug 5: one cancelled request left its chunks
queued forever), and malformed frames from the peer are dropped and counted while the
link goes on serving the next request (issue #34 item 8: one bad frame killed it).

The sending process plays a hostile peer first: it writes four frames ``DistTransport``
never writes (a header that is not JSON, a JSON list, a channel that is not a string, a
channel that routes elsewhere; ``_outq`` is reached into for that alone), then serves two
requests through the public API. Every process is ended by its pid."""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from refimpl import Receiver, Sender, State, channels, read_kv, write_kv
from refimpl.checksum import tensor_from_bytes
from tests.library.lib_helpers import MODEL, Procs, geo

G, N, TIMEOUT = geo(), 10, 60.0
DONE = "tok:a>rx"  # the sender's marker: every frame before it has arrived (FIFO per peer)


def _kv(seed: int) -> torch.Tensor:
    return torch.randn(2, 2, 4, N, 8, generator=torch.Generator().manual_seed(seed))


def _until(cond: Any, poll: Any) -> bool:
    end = time.monotonic() + TIMEOUT
    while not cond() and time.monotonic() < end:
        poll()
        time.sleep(0.002)
    return bool(cond())


def _receiver(t: Any) -> dict[str, Any]:
    pools = G.make_pools(16)
    rx = Receiver(pools, G, t, MODEL)
    rx.expect("a")
    _until(lambda: rx.state("a") is State.RECEIVING, lambda: rx.poll("a"))
    rx.abort("a", "cancelled by the test")  # before any chunk: all of them come late
    marker = []
    _until(lambda: marker, lambda: marker.extend(t.poll(DONE)))
    late = len(t.poll(channels("a").to_receiver))  # main: every chunk of attempt 1
    _until(lambda: rx.state("b").final, lambda: rx.poll("b"))
    got = rx.result("b") if rx.state("b") is State.DONE else None
    equal = got is not None and torch.equal(read_kv(pools, got.blocks, N), _kv(2))
    return {
        "a": rx.state("a").value,
        "late_kept": late,
        "b": rx.state("b").value,
        "b_equal": equal,
        "stats": {k: t.stats[k] for k in ("aborted", "fenced", "malformed", "misrouted")},
        "dropped": list(t.dropped),
        "held": len(rx.held()),
    }


def _hostile_frames(t: Any) -> None:
    for head in (b"{not json", b"[1, 2]", json.dumps({"ch": 5, "h": {}}).encode(),
                 json.dumps({"ch": "kv:zz>tx", "h": {"type": "ready"}}).encode()):  # fmt: skip
        size = torch.tensor([len(head), 0], dtype=torch.int64)
        t._outq[0].put([size, tensor_from_bytes(head, torch.uint8, (len(head),))])


def _sender(t: Any) -> dict[str, Any]:
    _hostile_frames(t)
    pools = G.make_pools(16)
    tx = Sender(pools, G, t, MODEL)
    out = {}
    for rid, seed in (("a", 1), ("b", 2)):
        blocks = pools.alloc.allocate(rid, G.blocks_for(N))
        write_kv(pools, rid, blocks, [list(layer) for layer in _kv(seed)])
        tx.offer(rid, list(range(N)), blocks=blocks, free_source=True)
        if rid == "a":
            time.sleep(1.0)  # the receiver has aborted before this side reads its ready
        _until(lambda rid=rid: tx.state(rid).final, lambda rid=rid: tx.poll(rid))
        out[rid] = tx.state(rid).value
        if rid == "a":
            t.send(DONE, {"sent": tx.stats("a")[0]})
    return {**out, "held": len(tx.held())}


def _body(rank: int, conn: Any) -> dict[str, Any]:
    import torch.distributed as dist

    from refimpl.transport_dist import DistTransport, handoff_route

    t = DistTransport(handoff_route(0, [1]))
    try:
        return _receiver(t) if rank == 0 else _sender(t)
    finally:
        t.close(timeout_s=TIMEOUT)
        dist.destroy_process_group()


def test_late_chunks_are_dropped_and_a_bad_frame_leaves_the_link_serving() -> None:
    with Procs(2, _body, TIMEOUT) as procs:
        out = [procs.report(r, TIMEOUT + 30) for r in range(2)]
    rx, tx = out
    assert rx["a"] == "aborted" and rx["late_kept"] == 0 and rx["stats"]["fenced"] >= 3
    assert tx["a"] in ("refused", "aborted") and tx["b"] == "done"
    assert rx["b"] == "done" and rx["b_equal"] and rx["held"] == 0 and tx["held"] == 0
    assert rx["stats"]["malformed"] == 3 and rx["stats"]["misrouted"] == 1, rx
