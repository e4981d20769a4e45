"""The chunked data path on small real tensors: verify before install, fence, cancel."""

from dataclasses import dataclass, replace

import pytest
import torch

from refimpl.blocks import BlockStatus
from refimpl.chunks import (
    ChunkReceiver,
    Snapshot,
    accept_manifest,
    build_manifest,
    freeze,
    release,
    send_chunks,
    send_manifest,
)
from refimpl.errors import (
    CancelledError,
    ChecksumError,
    ChunkError,
    FrozenError,
    IncompleteError,
    InUseError,
    ManifestError,
    OwnerError,
    StaleError,
)
from refimpl.pool import KVPool, PoolGeometry, copy_blocks
from refimpl.transport import Fault, InProcessTransport
from spec.manifest import LocalConfig, Manifest, RopeConfig

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
CTRL, DATA = "r/ctrl", "r/data"


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
    send_manifest(w.t, CTRL, m)
    return snap, m


def offer(w: World, channel: str = "data") -> tuple[Snapshot, Manifest]:
    """``start`` (epoch 1), then every chunk sent on ``channel``."""
    snap, m = start(w)
    send_chunks(w.t, channel, snap)
    return snap, m


def receiver(w: World, epoch: int = 1, local: LocalConfig = LOCAL) -> ChunkReceiver:
    [(header, _)] = w.t.poll(CTRL)
    m, verdict = accept_manifest(header, local)
    dest = w.dst.allocator.reserve("r", len(m.sent_blocks), epoch=epoch)
    return ChunkReceiver(w.dst, m, dest)


def dest_bytes(w: World, rx: ChunkReceiver) -> torch.Tensor:
    return w.dst.kv[[rx.dest[i] for i in sorted(rx.dest)]]


def test_handoff_installs_exact_bytes_then_source_is_released() -> None:
    w = world()
    snap, _ = start(w)
    rx = receiver(w)
    assert send_chunks(w.t, DATA, snap) == 3
    report = rx.pump(w.t, DATA)
    assert report.installed == [0, 1, 2] and rx.complete
    assert rx.commit() == [0, 1, 2]
    assert all(w.dst.allocator.status(b) is BlockStatus.OWNED for b in range(3))
    assert torch.equal(dest_bytes(w, rx), w.src.kv[w.src_blocks])
    assert w.src.allocator.free("r") == []  # the pin still holds the source
    assert release(w.src, snap) == [0, 1, 2]
    w.src.allocator.check_integrity()
    w.dst.allocator.check_integrity()


def test_frozen_source_refuses_writes_until_released() -> None:
    w = world()
    snap, _ = start(w)
    with pytest.raises(FrozenError):
        w.src.write_block("r", 0, torch.zeros(w.src.geometry.block_shape).half())
    release(w.src, snap)
    w.src.write_block("r", 0, torch.zeros(w.src.geometry.block_shape).half())


def test_corrupt_chunk_is_refused_before_install_and_retransmit_completes() -> None:
    w = world()
    snap, _ = start(w)
    rx = receiver(w)
    w.t.inject(DATA, Fault.CORRUPT, skip=1)  # flip a byte of block 1 in transit
    send_chunks(w.t, DATA, snap)
    report = rx.pump(w.t, DATA)
    assert report.corrupt == [1] and report.installed == [0, 2]
    assert torch.count_nonzero(w.dst.kv[rx.dest[1]]) == 0  # nothing landed
    with pytest.raises(ChecksumError, match=r"blocks \[1\] arrived corrupt"):
        rx.commit()
    send_chunks(w.t, DATA, snap)  # resend: blocks 0 and 2 are duplicates
    report = rx.pump(w.t, DATA)
    assert report.installed == [1] and report.duplicates == 2
    rx.commit()
    assert torch.equal(dest_bytes(w, rx), w.src.kv[w.src_blocks])


def test_stale_epoch_chunks_are_dropped() -> None:
    w = world()
    old = freeze(w.src, "r", epoch=0)  # an aborted earlier attempt, still sending
    snap, _ = start(w, epoch=1)
    rx = receiver(w, epoch=1)
    send_chunks(w.t, DATA, old)
    report = rx.pump(w.t, DATA)
    assert report.stale == 3 and report.installed == [] and rx.missing() == [0, 1, 2]
    assert torch.count_nonzero(dest_bytes(w, rx)) == 0
    with pytest.raises(StaleError):
        ChunkReceiver(w.dst, replace(rx.manifest, epoch=0), list(rx.dest.values()))
    release(w.src, old)
    release(w.src, snap)
    w.src.allocator.check_integrity()


def test_cancellation_between_chunks_stops_install() -> None:
    w = world()
    snap, _ = start(w)
    rx = receiver(w)
    send_chunks(w.t, DATA, snap)
    asked = iter([False, True, True])  # cancelled after the first chunk was handled
    report = rx.pump(w.t, DATA, is_cancelled=lambda: next(asked))
    assert report.installed == [0] and report.discarded == 2 and rx.cancelled
    assert torch.count_nonzero(w.dst.kv[rx.dest[1]]) == 0
    with pytest.raises(CancelledError):
        rx.commit()
    with pytest.raises(CancelledError):  # sticky
        rx.receive({"request_id": "r", "epoch": 1, "block_index": 1}, snap.payloads[1])
    # Cleanup: destination blocks wait in quarantine until the writer is proven stopped.
    assert w.dst.allocator.quarantine("r") == [0, 1, 2]
    assert w.t.abort(DATA) == 0
    assert w.dst.allocator.unquarantine_and_free("r", epoch=1) == [0, 1, 2]
    w.dst.allocator.check_integrity()


def test_sender_stops_sending_once_cancelled() -> None:
    w = world()
    snap, _ = start(w)
    assert send_chunks(w.t, DATA, snap, is_cancelled=lambda: w.t.stats["sent"] >= 2) == 1


def test_duplicate_reorder_and_loss() -> None:
    w = world()
    snap, _ = start(w)
    rx = receiver(w)
    w.t.inject(DATA, Fault.DUPLICATE)
    w.t.inject(DATA, Fault.REORDER)
    w.t.inject(DATA, Fault.LOSE)
    send_chunks(w.t, DATA, snap)
    report = rx.pump(w.t, DATA)  # 0 twice; 1 held back, 2 lost, so 1 arrives late
    assert report.installed == [0, 1] and report.duplicates == 1
    assert w.t.stats["lost"] == 1 and rx.missing() == [2]
    with pytest.raises(IncompleteError, match=r"\[2\]"):
        rx.commit()


def test_reordered_chunks_all_install() -> None:
    w = world()
    snap, _ = start(w)
    rx = receiver(w)
    w.t.inject(DATA, Fault.REORDER)
    send_chunks(w.t, DATA, snap)
    assert rx.pump(w.t, DATA).installed == [1, 0, 2]
    rx.commit()
    assert torch.equal(dest_bytes(w, rx), w.src.kv[w.src_blocks])


def test_full_prefix_hit_sends_zero_blocks_and_still_commits() -> None:
    w = world()
    snap, m = start(w, first_block=3)
    assert m.prefix_blocks == 3 and m.block_checksums == ()
    rx = receiver(w)
    assert send_chunks(w.t, DATA, snap) == 0 and rx.complete
    assert rx.commit() == []


def test_suffix_only_after_prefix() -> None:
    w = world()
    snap, m = start(w, first_block=2)
    rx = receiver(w)
    send_chunks(w.t, DATA, snap)
    assert rx.pump(w.t, DATA).installed == [2]
    rx.commit()
    assert torch.equal(w.dst.kv[rx.dest[2]], w.src.kv[w.src_blocks[2]])


def test_layout_conversion_at_install() -> None:
    tokens_major = replace(LOCAL, layout="tokens_major")
    w = world(dst_local=tokens_major)
    snap, _ = start(w)
    rx = receiver(w, local=tokens_major)
    send_chunks(w.t, DATA, snap)
    rx.pump(w.t, DATA)
    rx.commit()
    assert torch.equal(dest_bytes(w, rx).transpose(3, 4), w.src.kv[w.src_blocks])


def test_incompatible_or_hostile_manifest_installs_nothing() -> None:
    w = world()
    start(w)
    [(header, _)] = w.t.poll(CTRL)
    with pytest.raises(ManifestError) as info:
        accept_manifest(
            header, replace(LOCAL, model_id="other", head_dim=16, rope=RopeConfig(10000.0, 16))
        )
    assert [r.split(":")[0] for r in info.value.reasons] == [
        "model_id",
        "head_dim",
        "rope.rotary_dim",
    ]
    header["manifest"]["dtype"] = "float17"
    del header["manifest"]["epoch"]
    with pytest.raises(ManifestError) as info:
        accept_manifest(header, LOCAL)
    assert len(info.value.reasons) == 2 and info.value.prop == "ManifestGate"
    assert w.dst.allocator.counts()["free"] == 6


def test_receiver_refuses_unreserved_blocks_and_foreign_ranks() -> None:
    w = world()
    snap, m = start(w)
    w.dst.allocator.allocate("r", 3, epoch=1)  # owned, not reserved
    with pytest.raises(InUseError):
        ChunkReceiver(w.dst, m, [0, 1, 2])
    dest = w.dst.allocator.reserve("r", 3, epoch=1)
    rx = ChunkReceiver(w.dst, m, dest)
    send_chunks(w.t, DATA, snap, rank=1)
    assert rx.pump(w.t, DATA).malformed == 3
    with pytest.raises(ChunkError) as info:
        rx.receive({"request_id": "r", "epoch": 1, "block_index": 0, "rank": 1}, snap.payloads[0])
    assert info.value.prop == "RankAgreement"


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
