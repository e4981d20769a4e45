"""Prefill TP 2 -> decode TP 2, one OS process per rank on both sides (issue #30, "Done
when"): four processes in one gloo group over ``DistTransport``, ``RankSender`` per
prefill rank and ``RankReceiver`` per decode rank, the epochs from the router's
``TCPStore`` (this process: ``Epochs.open``). Request "a" goes layer by layer with a
block-size change (4 -> 8) and lands bit-exact on each decode rank (its own heads
only). Request "b": one rank's process is SIGKILLed mid-transfer, a prefill rank (rank
1, after it sent layer 0) or a decode rank (rank 1, once its layer 0 landed; prefill
rank 1 holds back layers 1-2 meanwhile, as a slow forward pass would); every surviving
rank must end with the dead rank's reason (the transport's failure detection: gloo's
link fails at once), not its own timeout, and hold 0 blocks. Every process is ended by
its pid."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
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


def _prefill(rank: int, t: Any, epochs: Epochs, conn: Any, dead: int) -> dict[str, Any]:
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
            if rid == "b" and rank == 1 and dead == 1:
                conn.send("layer 0 sent")
                time.sleep(3 * TIMEOUT)  # killed here, mid-transfer
            if rid == "b" and rank == 1 and dead == 3:  # layers 1, 2 wait for the kill
                _until(lambda rid=rid: tx.state(rid).final, lambda rid=rid: tx.poll(rid))
        _until(lambda rid=rid: tx.state(rid).final, lambda rid=rid: tx.poll(rid))
        if not tx.state(rid).final:
            tx.abort(rid, "timeout")
        pools.alloc.free(rid)  # the engine frees the request's blocks
        out[rid] = {"state": tx.state(rid).value, "reasons": tx.reasons(rid), "end": time.time(),
                    "held": len(tx.held()), "holders": list(pools.alloc.holders())}  # fmt: skip
    return out


def _decode(d: int, t: Any, conn: Any, dead: int) -> dict[str, Any]:
    pools = DST.make_rank_pools(d, 16)
    rx = RankReceiver(pools, DST, t, MODEL, rank=d, src_tp=2)
    out = {}
    for rid in RIDS:
        rx.expect(rid, decode_room=4)
        if rid == "b" and d + 2 == dead:
            _until(lambda: rx.rx.layer_ready(sub_id("b", d), 0), lambda: rx.poll("b"))
            conn.send("layer 0 landed")
            time.sleep(3 * TIMEOUT)  # killed here, mid-transfer
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


def _body(store_port: int, dead: int) -> Any:
    def body(rank: int, conn: Any) -> dict[str, Any]:
        import torch.distributed as dist

        from refimpl.api.ranks import rank_route
        from refimpl.transport_dist import DistTransport

        t = DistTransport(rank_route([0, 1], [2, 3], SRC.kv_heads))
        if rank < 2:
            store = dist.TCPStore("127.0.0.1", store_port, is_master=False,
                                  timeout=timedelta(seconds=TIMEOUT))  # fmt: skip
            out = _prefill(rank, t, Epochs(store), conn, dead)
        else:
            out = _decode(rank - 2, t, conn, dead)
        try:
            t.close(timeout_s=5.0)
        except TimeoutError:
            pass  # a link to the killed rank
        return out

    return body


@pytest.mark.parametrize("dead", [1, 3], ids=["prefill_rank_1", "decode_rank_1"])
def test_tp2_to_tp2_per_rank_bit_exact_then_a_killed_rank_ends_every_survivor(dead: int) -> None:
    import torch.distributed as dist

    store_port = free_port()
    router = dist.TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=TIMEOUT))  # fmt: skip
    epochs = Epochs(router)
    assert [epochs.open(rid) for rid in RIDS] == [1, 1]
    survivors = [r for r in range(4) if r != dead]
    with Procs(4, _body(store_port, dead), TIMEOUT) as procs:
        said = procs.recv(dead, 2 * TIMEOUT)
        assert said in ("layer 0 sent", "layer 0 landed"), said
        procs.kill(dead)  # mid-transfer: layers 1, 2 never leave or land
        killed = time.time()
        out = {r: procs.report(r, 2 * TIMEOUT) for r in survivors}
    for r in survivors:  # request "a": every rank done, each decode rank's heads bit-exact
        assert out[r]["a"]["state"] == "done", (r, out[r]["a"])
        assert r < 2 or out[r]["a"]["equal"], (r, out[r]["a"])
    took = {r: round(out[r]["b"]["end"] - killed, 2) for r in survivors}
    print(f"rank {dead} killed: survivors (group ranks) ended {took} s after the kill")
    for r in survivors:
        b = out[r]["b"]
        assert b["state"] == "aborted", (r, b)
        assert any(f"peer {dead} failed" in x for x in b["reasons"]), (r, b)  # the dead rank's
        assert not any("timeout" in x for x in b["reasons"]), (r, b)  # not its own timer
        assert b["held"] == 0 and b["holders"] == [], (r, b)
        assert took[r] < TIMEOUT / 2, took  # failure detection, well before any timer
