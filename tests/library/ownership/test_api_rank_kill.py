"""A prefill rank killed mid-transfer (issue #30, "Done when"): prefill TP 2 -> decode TP 1,
one OS process per rank over ``DistTransport`` (gloo), layer by layer. Rank 1 sends layer
0, then its process is SIGKILLed. The survivors (prefill rank 0, the decode side) must end
with the dead rank's reason (the transport's failure detection: its link fails at once),
not their own timeout, and hold 0 blocks. Every process is ended by its pid."""

from __future__ import annotations

import time
from typing import Any

import torch

from refimpl import KVGeometry, Receiver, Sender, State, write_kv_layer
from tests.library.lib_helpers import MODEL, Procs

SRC = KVGeometry(3, 4, 8, 4, "float32", tp=2)
DST = KVGeometry(3, 4, 8, 8, "float32")
N, RID, TIMEOUT = 10, "r", 30.0


def _prefill(rank: int, t: Any, conn: Any) -> dict[str, Any]:
    pools = SRC.make_rank_pools(rank, 8)
    tx = Sender(pools, SRC, t, MODEL, rank=rank)
    blocks = pools.alloc.allocate(RID, SRC.blocks_for(N))
    kv = torch.randn(3, 2, 4, N, 8, generator=torch.Generator().manual_seed(0))
    h = slice(2 * rank, 2 * rank + 2)
    tx.offer(RID, list(range(N)), blocks=blocks, layers=3, epoch=1, free_source=True)
    end = time.monotonic() + TIMEOUT
    for layer in range(3):
        write_kv_layer(pools, RID, blocks, layer, [kv[layer, 0, h], kv[layer, 1, h]])
        while tx.state(RID) is State.OFFERED and time.monotonic() < end:
            tx.poll(RID)  # wait for the ready, so the layer leaves now
            time.sleep(0.002)
        tx.send_layer(RID, layer)
        if rank == 1:
            conn.send("layer 0 sent")
            time.sleep(3 * TIMEOUT)  # killed here, mid-transfer
    while not tx.state(RID).final and time.monotonic() < end:
        tx.poll(RID)
        time.sleep(0.002)
    if not tx.state(RID).final:
        tx.abort(RID, "timeout")
    if tx.state(RID) is not State.DONE and pools.alloc.blocks_of(RID):
        pools.alloc.free(RID)  # the engine frees a failed request's blocks
    return {"state": tx.state(RID).value, "reasons": tx.reasons(RID), "end": time.time(),
            "held": len(tx.held()), "blocks": len(pools.alloc.holders())}  # fmt: skip


def _decode(t: Any) -> dict[str, Any]:
    pools = DST.make_pools(16)
    rx = Receiver(pools, DST, t, MODEL)
    rx.expect(RID, decode_room=4)
    end = time.monotonic() + TIMEOUT
    while not rx.state(RID).final and time.monotonic() < end:
        rx.poll(RID)
        time.sleep(0.002)
    if not rx.state(RID).final:
        rx.abort(RID, "timeout")
    return {"state": rx.state(RID).value, "error": str(rx.error(RID)), "end": time.time(),
            "held": len(rx.held()), "blocks": len(pools.alloc.holders())}  # fmt: skip


def _body(rank: int, conn: Any) -> dict[str, Any]:
    from refimpl.transport_dist import DistTransport, handoff_route

    t = DistTransport(handoff_route(2, [0, 1]))
    out = _decode(t) if rank == 2 else _prefill(rank, t, conn)
    try:
        t.close(timeout_s=5.0)
    except TimeoutError:
        pass  # the link to the killed rank
    return out


def test_a_killed_prefill_rank_ends_every_survivor_with_its_reason() -> None:
    with Procs(3, _body, TIMEOUT) as procs:
        assert procs.recv(1, TIMEOUT + 30) == "layer 0 sent", "rank 1 never sent its layer 0"
        procs.kill(1)  # mid-transfer: layers 1, 2 never leave
        killed = time.time()
        pre, dec = procs.report(0, TIMEOUT + 30), procs.report(2, TIMEOUT + 30)
    took = [round(x["end"] - killed, 2) for x in (pre, dec)]
    print(f"survivors (prefill rank 0, decode) ended {took} s after the kill")
    assert dec["state"] == "aborted" and "peer 1 failed" in dec["error"], dec
    assert pre["state"] == "aborted" and any("peer 1 failed" in x for x in pre["reasons"]), pre
    assert "timeout" not in dec["error"] and not any("timeout" in x for x in pre["reasons"])
    assert dec["held"] == dec["blocks"] == 0 and pre["held"] == pre["blocks"] == 0
