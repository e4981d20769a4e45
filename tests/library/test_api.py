"""The public handoff API end to end: every conversion lands the same tokens, and every
failure leaves nothing held on either side (narrated scenarios with exact outcomes)."""

from __future__ import annotations

import pytest
import torch

from refimpl import KVGeometry, Receiver, State, channels, handoff, read_kv
from refimpl.errors import (
    CancelledError,
    CapacityError,
    ChecksumError,
    ChunkError,
    ManifestError,
)
from refimpl.transport import Fault
from spec.manifest import LocalConfig
from tests.library.lib_helpers import MODEL, geo, held, pair, prefill

VARIANTS = {
    "same": ({}, {}),
    "tp2_to_1": ({"tp": 2}, {}),
    "tp1_to_4": ({}, {"tp": 4}),
    "tp4_to_2_tokens_major": ({"tp": 4}, {"tp": 2, "layout": "tokens_major"}),
    "block_4_to_3": ({}, {"block_size": 3}),
    "tokens_major_tp2_to_block8": ({"tp": 2, "layout": "tokens_major"}, {"block_size": 8}),
    "gqa_replicated_kv2_tp4": ({"kv_heads": 2, "tp": 4}, {"kv_heads": 2, "block_size": 2}),
    "bf16": ({"dtype": "bfloat16"}, {"dtype": "bfloat16", "tp": 2}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_handoff_lands_the_same_tokens(name: str) -> None:
    src_kw, dst_kw = VARIANTS[name]
    p = pair(geo(**src_kw), geo(**dst_kw))
    kv = prefill(p, "r", 10, room_blocks=1)
    res = handoff(p.tx, p.rx, "r", list(range(10)), decode_room=5)
    got = res.received
    assert torch.equal(read_kv(p.dst, got.blocks, 10), kv)
    assert len(got.blocks) == p.rx.geometry.blocks_for(15)
    assert held(p.src) == {}  # pins released and the request freed at the source
    assert held(p.dst) == {"owned": len(got.blocks)}
    assert set(p.dst.alloc.blocks_of("r")) == set(got.blocks)


def test_freeze_pins_only_the_blocks_it_sends() -> None:
    """An engine that reserved decode room gets its room neither pinned nor sent."""
    p = pair(geo(), geo())
    prefill(p, "r", 6, room_blocks=3)  # 2 blocks hold the tokens, 3 are room
    held_blocks = p.src.alloc.blocks_of("r")
    m = p.tx.offer("r", list(range(6)))
    assert len(m.block_checksums) == 2
    assert [p.src.alloc.refcount(b) for b in held_blocks] == [2, 2, 1, 1, 1]
    p.tx.abort("r", "test")
    assert [p.src.alloc.refcount(b) for b in held_blocks] == [1] * 5


def test_explicit_blocks_must_cover_the_tokens() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 6)
    with pytest.raises(ChunkError, match="needs 2"):
        p.tx.offer("r", list(range(6)), blocks=p.src.alloc.blocks_of("r")[:1])
    assert held(p.src) == {"owned": 2}  # nothing pinned


def _refused(p, exc: type[Exception], match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc, match=match):
        handoff(p.tx, p.rx, "r", list(range(10)), decode_room=2)
    assert held(p.dst) == {}
    assert held(p.src) == {"owned": 3}  # the request's own blocks, no pin left
    p.src.alloc.free("r")
    assert held(p.src) == {}


def test_manifest_mismatch_is_refused_with_a_nack() -> None:
    p = pair(geo(), geo(head_dim=16))
    prefill(p, "r", 10)
    _refused(p, ManifestError, "head_dim")
    assert p.tx.state("r") is State.REFUSED
    assert any("head_dim" in r for r in p.tx.reasons("r"))


def test_full_receiver_is_refused_and_the_source_released() -> None:
    p = pair(geo(), geo(), dst_cap=2)
    prefill(p, "r", 10)
    _refused(p, CapacityError, "asks for 3 blocks, 2 free")
    assert p.tx.state("r") is State.REFUSED


def test_corrupt_chunk_names_the_block_and_gives_everything_back() -> None:
    p = pair(geo(), geo(block_size=2))
    prefill(p, "r", 10)
    p.t.inject(channels("r").to_receiver, Fault.CORRUPT, skip=2)  # manifest, chunk 0, then 1
    _refused(p, ChecksumError, r"block 1 \(rank 0\)")
    assert p.tx.state("r") is State.ABORTED


def test_lost_chunk_times_out_on_both_ends() -> None:
    p = pair(geo(tp=2), geo())
    prefill(p, "r", 10)
    p.t.inject(channels("r").to_receiver, Fault.LOSE, skip=3)
    _refused(p, CancelledError, "timeout")


def test_duplicates_and_reorders_are_harmless() -> None:
    p = pair(geo(), geo(tp=2))
    kv = prefill(p, "r", 10)
    ch = channels("r").to_receiver
    p.t.inject(ch, Fault.DUPLICATE, skip=1)
    p.t.inject(ch, Fault.REORDER)
    res = handoff(p.tx, p.rx, "r", list(range(10)))
    assert torch.equal(read_kv(p.dst, res.received.blocks, 10), kv)


def test_sender_cancel_mid_transfer_frees_the_receiver() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.rx.expect("r", decode_room=4)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")  # manifest: 4 blocks reserved
    assert held(p.dst) == {"reserved": 4}
    p.tx.poll("r")  # ready: chunks sent
    p.tx.abort("r", "client cancelled")
    p.rx.poll("r")
    assert p.rx.state("r") is State.ABORTED
    assert held(p.dst) == {}
    assert held(p.src) == {"owned": 3}


def test_receiver_crash_mid_transfer_sender_times_out() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")
    p.rx.crash()  # its pools and attempts are gone
    p.tx.poll("r")  # ready was sent before the crash: chunks go out to nobody
    assert p.tx.state("r") is State.SENDING
    p.tx.abort("r", "timeout")
    assert held(p.src) == {"owned": 3} and held(p.dst) == {}


def test_sender_crash_receiver_aborts() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")
    p.tx.crash()
    p.rx.abort("r", "peer gone")
    assert held(p.dst) == {} and held(p.src) == {}
    with pytest.raises(CancelledError, match="peer gone"):
        p.rx.result("r")


def test_receiver_geometry_is_checked_when_built() -> None:
    pools = geo(block_size=8).make_pools(4)
    with pytest.raises(ValueError, match="receiver pools do not match"):
        Receiver(pools, geo(), pair(geo(), geo()).t, MODEL)


def test_geometry_converters_round_trip() -> None:
    g = geo(tp=2, layout="tokens_major", kv_heads=2)
    local = g.to_local_config(MODEL)
    assert isinstance(local, LocalConfig)
    assert KVGeometry.from_local_config(local) == g
    assert g.kv_heads_per_rank == 1 and g.kv_layout().local_dims.kv_heads == 1
    assert g.rank_pool_geometry().kv_heads == 1
    with pytest.raises(ValueError, match="dtype='float64'"):
        geo(dtype="float64")
    with pytest.raises(ValueError, match="tp"):
        geo(kv_heads=3, tp=2)
