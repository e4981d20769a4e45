"""Prefill TP 2 -> decode TP 2, one OS process per rank on both sides (issue #30, "Done
when"): four processes in one gloo group over ``DistTransport``, ``RankSender`` per
prefill rank and ``RankReceiver`` per decode rank, the epochs from the router's
``TCPStore`` (this process: ``Epochs.open``). Request "a" goes layer by layer with a
block-size change (4 -> 8) and lands bit-exact on each decode rank (its own heads
only). Request "b": prefill rank 1 sends layer 0, then its process is SIGKILLed; every
surviving rank (prefill rank 0, both decode ranks) must end with the dead rank's reason
(the transport's failure detection: gloo's link fails at once), not its own timeout,
and hold 0 blocks. Every process is ended by its pid."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch

from refimpl import KVGeometry, read_kv, write_kv_layer
from refimpl.api.ranks import Epochs, RankReceiver, RankSender, sub_id
from tests.library.lib_helpers import MODEL, Procs, free_port

SRC = KVGeometry(3, 4, 8, 4, "float32", tp=2)
DST = KVGeometry(3, 4, 8, 8, "float32", tp=2)
N, TIMEOUT, RIDS = 13, 30.0, ("a", "b")


def _kv(rid: str) -> torch.Tensor:
    return torch.randn(3, 2, 4, N, 8, generator=torch.Generator().manual_seed(ord(rid)))


def _until(done: Any, poll: Any) -> None:
    end = time.monotonic() + TIMEOUT
    while not done() and time.monotonic() < end:
        poll()
        time.sleep(0.002)


def _prefill(rank: int, t: Any, epochs: Epochs, conn: Any) -> dict[str, Any]:
    pools = SRC.make_rank_pools(rank, 16)
    tx = RankSender(pools, SRC, t, MODEL, rank=rank, dst_tp=2, epochs=epochs)
    out = {}
    for rid in RIDS:
        blocks = pools.alloc.allocate(rid, SRC.blocks_for(N))
        kv = _kv(rid)[:, :, 2 * rank : 2 * rank + 2]
        tx.offer(rid, list(range(N)), blocks=blocks)
        for layer in range(3):
            write_kv_layer(pools, rid, blocks, layer, [kv[layer, 0], kv[layer, 1]])
            tx.send_layer(rid, layer)
            tx.poll(rid)
            if rid == "b" and rank == 1:
                conn.send("layer 0 sent")
                time.sleep(3 * TIMEOUT)  # killed here, mid-transfer
        _until(lambda rid=rid: tx.state(rid).final, lambda rid=rid: tx.poll(rid))
        if not tx.state(rid).final:
            tx.abort(rid, "timeout")
        pools.alloc.free(rid)  # the engine frees the request's blocks
        out[rid] = {"state": tx.state(rid).value, "reasons": tx.reasons(rid), "end": time.time(),
                    "held": len(tx.held()), "holders": list(pools.alloc.holders())}  # fmt: skip
    return out


def _decode(d: int, t: Any) -> dict[str, Any]:
    pools = DST.make_rank_pools(d, 16)
    rx = RankReceiver(pools, DST, t, MODEL, rank=d, src_tp=2)
    out = {}
    for rid in RIDS:
        rx.expect(rid, decode_room=4)
        _until(lambda rid=rid: rx.state(rid).final, lambda rid=rid: rx.poll(rid))
        if not rx.state(rid).final:
            rx.abort(rid, "timeout")
        equal = False
        if rx.ready(rid):
            got = read_kv(pools, rx.blocks(rid), N)
            equal = torch.equal(got, _kv(rid)[:, :, 2 * d : 2 * d + 2])
            pools.alloc.free(sub_id(rid, d))  # decode finished with it
        out[rid] = {"state": rx.state(rid).value, "reasons": rx.reasons(rid), "equal": equal,
                    "end": time.time(), "held": len(rx.held()),
                    "holders": list(pools.alloc.holders())}  # fmt: skip
    return out


def _body(store_port: int) -> Any:
    def body(rank: int, conn: Any) -> dict[str, Any]:
        import torch.distributed as dist

        from refimpl.api.ranks import rank_route
        from refimpl.transport_dist import DistTransport

        t = DistTransport(rank_route([0, 1], [2, 3], SRC.kv_heads))
        if rank < 2:
            store = dist.TCPStore("127.0.0.1", store_port, is_master=False,
                                  timeout=timedelta(seconds=TIMEOUT))  # fmt: skip
            out = _prefill(rank, t, Epochs(store), conn)
        else:
            out = _decode(rank - 2, t)
        try:
            t.close(timeout_s=5.0)
        except TimeoutError:
            pass  # a link to the killed rank
        return out

    return body


def test_tp2_to_tp2_per_rank_bit_exact_then_a_killed_rank_ends_every_survivor() -> None:
    import torch.distributed as dist

    store_port = free_port()
    router = dist.TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=TIMEOUT))  # fmt: skip
    epochs = Epochs(router)
    assert [epochs.open(rid) for rid in RIDS] == [1, 1]
    with Procs(4, _body(store_port), TIMEOUT) as procs:
        assert procs.recv(1, 2 * TIMEOUT) == "layer 0 sent", "prefill rank 1 never sent layer 0"
        procs.kill(1)  # mid-transfer: layers 1, 2 never leave
        killed = time.time()
        out = {r: procs.report(r, 2 * TIMEOUT) for r in (0, 2, 3)}
    for r in (2, 3):  # request "a": every decode rank ready, its own heads bit-exact
        assert out[r]["a"]["state"] == "done" and out[r]["a"]["equal"], out[r]["a"]
    assert out[0]["a"]["state"] == "done", out[0]["a"]
    took = {r: round(out[r]["b"]["end"] - killed, 2) for r in (0, 2, 3)}
    print(f"survivors (prefill 0, decode 0, decode 1) ended {took} s after the kill")
    for r in (0, 2, 3):
        b = out[r]["b"]
        assert b["state"] == "aborted", (r, b)
        assert any("peer 1 failed" in x for x in b["reasons"]), (r, b)  # the dead rank's
        assert not any("timeout" in x for x in b["reasons"]), (r, b)  # not its own timer
        assert b["held"] == 0 and b["holders"] == [], (r, b)
        assert took[r] < TIMEOUT / 2, took  # failure detection, well before any timer
