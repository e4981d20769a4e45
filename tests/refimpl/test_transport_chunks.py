"""The chunked data path's parts on small real tensors (freeze pins, ``send_chunks``, the
transport carries JSON and bytes only, offload and reload through a host pool), and the
public API's receiving end (``refimpl.api.Receiver``, the one receive path) where a peer
sends what it must not: a manifest whose every block the receiver already holds, a
hostile manifest, a chunk of a rank the manifest does not name."""

from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from refimpl.api import State, channels, read_kv, write_kv
from refimpl.chunks import Snapshot, build_manifest, freeze, release, send_chunks
from refimpl.errors import ChunkError, FrozenError, ManifestError, OwnerError
from refimpl.pool import KVPool, PoolGeometry, copy_blocks
from refimpl.transport import Inbox, InProcessTransport
from spec.manifest import LocalConfig, Manifest, RopeConfig
from tests.library.lib_helpers import Pair, geo, held, pair, prefill

LOCAL = LocalConfig(
    model_id="tiny",
    adapter_id=None,
    dtype="float16",
    quantization="none",
    num_layers=2,
    kv_heads=2,
    head_dim=8,
    block_size=4,
    layout="heads_major",
    rope=RopeConfig(10000.0, 8),
    tp=1,
    cp=1,
)
DATA = "r/data"


@dataclass
class World:
    src: KVPool
    dst: KVPool
    t: InProcessTransport
    src_blocks: list[int]


def world(tokens: int = 12, dst_local: LocalConfig = LOCAL) -> World:
    """Prefill wrote request "r" (3 blocks) into blocks [0, 1, 2] of the source pool."""
    torch.manual_seed(0)
    src = KVPool(6, PoolGeometry.of_local(LOCAL))
    dst = KVPool(6, PoolGeometry.of_local(dst_local))
    blocks = src.allocator.allocate("r", -(-tokens // 4))
    src.write_blocks("r", blocks, torch.randn(len(blocks), *src.geometry.block_shape).half())
    return World(src, dst, InProcessTransport(), blocks)


def start(w: World, epoch: int = 1, first_block: int = 0) -> tuple[Snapshot, Manifest]:
    snap = freeze(w.src, "r", epoch, first_block=first_block)
    tokens = 4 * len(w.src_blocks)
    m = build_manifest(snap, LOCAL, token_ids=range(tokens), dst_tp=1, dst_cp=1)
    return snap, m


def sent(tokens: int = 10, **dst: object) -> tuple[Pair, list[tuple[dict, bytes]]]:
    """An API pair: "r" offered, the manifest taken (blocks reserved), the ready read;
    returns the chunks the sender sent, taken off the wire (the caller delivers them)."""
    p = pair(geo(), geo(**dst))
    prefill(p, "r", tokens)
    p.tx.offer("r", list(range(tokens)))
    p.rx.poll("r")
    p.tx.poll("r")
    return p, p.t.poll(channels("r").to_receiver)


def deliver(p: Pair, chunks: list[tuple[dict, bytes]]) -> None:
    for header, payload in chunks:
        p.t.send(channels("r").to_receiver, header, payload)
    p.rx.poll("r")


def test_frozen_source_refuses_writes_until_released() -> None:
    w = world()
    snap, _ = start(w)
    with pytest.raises(FrozenError):
        w.src.write_block("r", 0, torch.zeros(w.src.geometry.block_shape).half())
    release(w.src, snap)
    w.src.write_block("r", 0, torch.zeros(w.src.geometry.block_shape).half())


def test_sender_stops_sending_once_cancelled() -> None:
    w = world()
    snap, _ = start(w)
    assert send_chunks(w.t, DATA, snap, is_cancelled=lambda: w.t.stats["sent"] >= 1) == 1
    assert len(w.t.poll(DATA)) == 1


def test_only_json_crosses_the_transport() -> None:
    t = InProcessTransport(copy_payload=True)
    header = {"k": [1, 2]}
    payload = bytearray(b"abc")
    t.send("c", header, payload)
    header["k"].append(3)
    payload[0] = 0
    [(got, data)] = t.poll("c")
    assert got == {"k": [1, 2]} and bytes(data) == b"abc"
    with pytest.raises(TypeError):
        t.send("c", {"tensor": torch.zeros(1)})
    with pytest.raises(ValueError):
        t.send("c", {"x": float("nan")})


def test_offload_reload_round_trip_through_host_pool() -> None:
    w = world()
    host = KVPool.host_pool(4, w.src.geometry)
    before = w.src.kv[w.src_blocks].clone()
    ids = host.allocator.reserve("r", 3, epoch=1)
    copy_blocks(w.src, w.src_blocks, host, ids, "r")
    host.allocator.commit("r", epoch=1)
    w.src.allocator.free("r")
    w.src.kv.zero_()  # the GPU blocks are reused meanwhile
    back = w.src.allocator.reserve("r", 3, epoch=2)
    assert back == [3, 4, 5]  # not the original ids: the block table is rebuilt
    with pytest.raises(OwnerError):
        copy_blocks(host, ids, w.src, back, "someone-else")
    copy_blocks(host, ids, w.src, back, "r")
    w.src.allocator.commit("r", epoch=2)
    host.allocator.free("r")
    assert torch.equal(w.src.kv[back], before)
    w.src.allocator.check_integrity()
    host.allocator.check_integrity()


def test_full_prefix_hit_sends_zero_blocks_and_still_commits() -> None:
    """Every block of the request is a prefix the receiver holds: no chunk, a commit."""
    p = pair(geo(), geo())
    kv = prefill(p, "r", 8)
    mine = p.dst.alloc.allocate("cache", 2)
    write_kv(p.dst, "cache", mine, [list(layer) for layer in kv])
    p.rx.expect("r", prefix=mine, prefix_tokens=list(range(8)))
    m = p.tx.offer("r", list(range(8)), prefix_blocks=2)
    assert m.prefix_blocks == 2 and m.block_checksums == ()
    for _ in range(3):
        p.rx.poll("r")
        p.tx.poll("r")
    assert p.tx.stats("r") == (0, 0) and p.rx.state("r") is State.DONE
    got = p.rx.result("r")
    assert list(got.blocks) == mine and torch.equal(read_kv(p.dst, got.blocks, 8), kv)


def test_a_hostile_manifest_is_refused_with_every_reason_and_reserves_nothing() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    ch = channels("r").to_receiver
    [(header, _)] = p.t.poll(ch)
    header["manifest"]["dtype"] = "float17"
    del header["manifest"]["num_tokens"]
    p.t.send(ch, header)
    p.rx.poll("r")
    assert p.rx.state("r") is State.REFUSED and held(p.dst) == {}
    err = p.rx.error("r")
    assert isinstance(err, ManifestError) and err.prop == "ManifestGate"
    assert {r.split(":")[0] for r in err.reasons} >= {"dtype", "num_tokens"}, err.reasons
    p.tx.poll("r")
    assert p.tx.state("r") is State.REFUSED and held(p.src) == {"owned": 3}


def test_a_chunk_of_a_rank_the_manifest_does_not_name_aborts_by_name() -> None:
    p, chunks = sent()
    (header, payload), *_ = chunks
    deliver(p, [({**header, "rank": 1}, payload)])
    err = p.rx.error("r")
    assert p.rx.state("r") is State.ABORTED and isinstance(err, ChunkError)
    assert err.prop == "RankAgreement" and "rank 1" in str(err)
    assert held(p.dst) == {}


FAULT_COUNTERS = ("lost", "duplicated", "reordered", "corrupted")


@pytest.mark.parametrize(
    ("fault", "counter", "order"),
    [
        ("lose", "lost", [0, 2]),
        ("duplicate", "duplicated", [0, 1, 1, 2]),
        ("reorder", "reordered", [0, 2, 1]),
        ("corrupt", "corrupted", [0, 1, 2]),
    ],
)
def test_each_fault_falls_on_its_message_and_is_counted_once(
    fault: str, counter: str, order: list[int]
) -> None:
    t = InProcessTransport()
    t.inject("c", fault, skip=1)
    for i in range(3):
        t.send("c", {"i": i}, bytes([i, i]))
    got = t.poll("c")
    assert [h["i"] for h, _ in got] == order
    changed = [h["i"] for h, p in got if bytes(p) != bytes([h["i"], h["i"]])]
    assert changed == ([1] if fault == "corrupt" else [])
    assert {k: t.stats[k] for k in FAULT_COUNTERS} == {k: int(k == counter) for k in FAULT_COUNTERS}
    assert t.stats["sent"] == 3 and t.stats["delivered"] == len(order)


def test_an_inbox_counts_what_it_keeps_from_zero() -> None:
    box: Inbox[str] = Inbox(Counter(), max_messages=2, max_bytes=10)
    assert box.sizes() == {"channels": 0, "messages": 0, "bytes": 0, "fences": 0}
    assert box.put("a", "x", 1, 4) and box.put("b", "y", 1, 6)
    assert box.sizes() == {"channels": 2, "messages": 2, "bytes": 10, "fences": 0}
    assert box.put("a", "z", 1, 0)  # a third message: past max_messages, b gives way
    assert box.take("a") == ["x", "z"] and box.take("b") == []
    assert box.sizes() == {"channels": 0, "messages": 0, "bytes": 0, "fences": 0}
    assert box.put("a", "w", 1, 10)  # all ten bytes again, once the others were taken
