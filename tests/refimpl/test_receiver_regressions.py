"""Regression tests of the three receiver bugs of issue #13, each on the documented path.

1. Zero-filled blocks committed: ``ChunkReceiver`` marked a block installed before the
   install ran; a failed install (a pool of another geometry) still let ``commit`` succeed.
2. A corrupt chunk hid: ``commit`` said ``IncompleteError`` without naming the checksum,
   and the installed blocks stayed reserved (no documented way back to the pool).
3. A full receiver leaked the source: the demo's ``handoff`` let ``CapacityError`` escape
   without a nack, and the source's pins stayed after the request was freed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from refimpl.blocks import BlockStatus
from refimpl.chunks import ChunkReceiver, accept_manifest
from refimpl.demo.handoff import Worker, handoff
from refimpl.errors import CapacityError, ChecksumError, ChunkError, IncompleteError
from refimpl.model import TinyConfig, TinyDecoder
from refimpl.pool import KVPool, PoolGeometry
from refimpl.transport import Fault, InProcessTransport
from tests.refimpl.test_transport_chunks import LOCAL, offer, world


def test_1_pool_of_another_geometry_is_refused_when_the_receiver_is_built() -> None:
    w = world()
    _, m = offer(w)
    wrong = KVPool(6, replace(PoolGeometry.of_local(LOCAL), head_dim=4))
    dest = wrong.allocator.reserve("r", 3, epoch=1)
    with pytest.raises(ChunkError, match="cannot be installed into pool blocks"):
        ChunkReceiver(wrong, m, dest)
    assert [wrong.allocator.status(b) for b in dest] == [BlockStatus.RESERVED] * 3


@pytest.mark.parametrize("overlap", [True, False])
def test_1_a_failed_install_is_not_counted_and_commit_refuses(
    overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world()
    _, m = offer(w)
    dest = w.dst.allocator.reserve("r", 3, epoch=1)
    rx = ChunkReceiver(w.dst, m, dest)
    real = w.dst.write_block_bytes

    def flaky(holder, b, data, src_geometry=None):  # type: ignore[no-untyped-def]
        if b == dest[1]:
            raise RuntimeError("device copy failed")
        real(holder, b, data, src_geometry)

    monkeypatch.setattr(w.dst, "write_block_bytes", flaky)
    with pytest.raises(RuntimeError, match="device copy failed"):
        rx.pump(w.t, "data", overlap=overlap)
    assert 1 not in rx.installed and 0 in rx.installed and not rx.complete
    assert torch.count_nonzero(w.dst.kv[dest[1]]) == 0
    with pytest.raises(IncompleteError, match=r"blocks \[1(, 2)?\] not installed"):
        rx.commit()
    assert [w.dst.allocator.status(b) for b in dest] == [BlockStatus.RESERVED] * 3
    assert sorted(rx.abort()) == sorted(dest)
    assert w.dst.allocator.counts()["free"] == w.dst.capacity


def test_2_corrupt_chunk_fails_commit_naming_the_block_and_abort_frees() -> None:
    w = world()
    w.t.inject("data", Fault.CORRUPT, skip=2)  # block 2's bytes flipped in transit
    _, offered = offer(w)
    m, _ = accept_manifest({"manifest": offered.to_json_dict()}, LOCAL)
    dest = w.dst.allocator.reserve("r", 3, epoch=1)
    rx = ChunkReceiver(w.dst, m, dest)
    report = rx.pump(w.t, "data")
    assert report.corrupt == [2] and report.installed == [0, 1]
    with pytest.raises(ChecksumError, match=r"blocks \[2\] arrived corrupt"):
        rx.commit()
    assert sorted(rx.abort()) == sorted(dest)
    w.dst.allocator.check_integrity()
    assert w.dst.allocator.counts() == {"free": 6, "reserved": 0, "owned": 0, "quarantined": 0}


def test_3_full_receiver_nacks_and_the_source_keeps_no_pin() -> None:
    cfg = TinyConfig(dtype="float32")
    model = TinyDecoder(cfg, seed=0)
    src = Worker(model, tp=2, block_size=4, layout="heads_major", capacity=8)
    dst = Worker(model, tp=1, block_size=4, layout="heads_major", capacity=2)
    prompt = torch.arange(13) % cfg.vocab
    src.prefill("r", prompt)
    t = InProcessTransport(copy_payload=True)
    with pytest.raises(CapacityError, match="asks for 4 blocks, 2 free"):
        handoff(src, dst, "r", prompt.tolist(), first_token=0, transport=t)
    assert t.stats["sent"] > 0 and src.rp.alloc.holders() == ("r",)  # no pin left
    src.finish("r")
    assert src.rp.alloc.counts()["owned"] == 0 and dst.rp.alloc.counts()["free"] == 2
    src.rp.alloc.check_integrity()
    dst.rp.alloc.check_integrity()
