"""Narrated engine scenarios with exact block ids: handoff, offload/reload, cancel, prefix
reuse, crashes. Every step is also taken on the spec (``Drive``), and after every step
the conservation law holds and every committed replica's bytes equal the ground truth.
The incidents and the seed's failures are in ``test_engine_incidents.py``.
"""

from __future__ import annotations

import torch

from refimpl.blocks import BlockStatus
from refimpl.engine.wire import parse
from spec.config import CONFIGS
from spec.manifest import from_json_dict
from spec.state import COMPLETE, FAILED, FINISHED, QUARANTINED, RUNNING, WRITABLE
from tests.refimpl.engine_helpers import Drive, assert_quiescent


def handoff_until_sent(d: Drive, epoch: int = 1, req: int = 0) -> None:
    """Freeze, reserve, ready, and every chunk and RankDone sent (rank-major)."""
    d("PrefillFreeze", req=req)
    d.msg("DecodeReserve", "Handoff", epoch, req=req)
    d.msg("PrefillRecvReady", "Ready", epoch, req=req)
    while d.w.reqs[req].ps == 2:  # SENDING
        d("PrefillSendChunk", req=req)


def test_handoff_tp2_to_1_installs_every_byte_then_the_source_lets_go() -> None:
    d = Drive(CONFIGS["handoff_tp2to1"])
    e = d.eng
    # Prefill TP=2: one KV head per rank, heads_major [cap, layers, 2, heads, bs, D].
    # Decode TP=1 holds both heads, tokens_major [cap, layers, 2, bs, heads, D].
    assert e.P.pools[0].kv.shape == e.P.pools[1].kv.shape == (2, 2, 2, 1, 2, 4)
    assert e.D.pools[0].kv.shape == (2, 2, 2, 2, 2, 4) and e.D.geometry.layout == "tokens_major"
    d("PrefillAdmit", req=0)
    assert e.P.alloc.blocks_of("r0") == (0, 1)  # one block table for both ranks
    d("PrefillRun", req=0)
    assert torch.equal(e.replica(0, "p"), e.truth[0])
    d("PrefillFreeze", req=0)
    assert e.P.alloc.blocks_of("r0@pin1") == (0, 1) and e.P.alloc.refcount(0) == 2
    d.refused("PrefillDecodeStep", "FrozenSnapshot", req=0)  # the snapshot is read-only
    m = from_json_dict(parse(e.wire.entries("0>d")[0][0])["manifest"])
    assert (m.layout, m.src_tp, m.dst_tp, m.kv_heads, m.epoch) == ("heads_major", 2, 1, 2, 1)
    assert len(m.block_checksums) == 2 and m.token_ids == (100, 101, 102, 103)

    d.msg("DecodeReserve", "Handoff", 1)
    assert e.D.alloc.blocks_of("r0") == (0, 1)
    assert {e.D.alloc.status(b) for b in (0, 1)} == {BlockStatus.RESERVED}
    assert parse(e.wire.entries("0>p")[0][0])["dst"] == [0, 1]  # where the writes go
    d.msg("PrefillRecvReady", "Ready", 1)
    for _ in range(6):  # rank 0: chunks 0, 1, RankDone 0; rank 1: chunks 2, 3, RankDone 1
        d("PrefillSendChunk", req=0)
    assert sorted(parse(t)["idx"] for t, _ in e.wire.entries("0>d")) == [0, 0, 1, 1, 2, 3]
    for idx in (3, 1, 2, 0):  # delivery order is free
        d.msg("DecodeReceiveChunk", "Chunk", 1, idx)
    d.refused("DecodeValidate", "RankAgreement", req=0)  # no rank has reported yet
    d.msg("DecodeReceiveDone", "RankDone", 1, 1)
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d("DecodeValidate", req=0)
    assert torch.equal(e.replica(0, "d"), e.truth[0])  # resharded 2->1, relaid out
    assert {e.D.alloc.status(b) for b in (0, 1)} == {BlockStatus.OWNED}
    d("DecodeCommit", req=0)
    assert (d.w.reqs[0].p, d.w.reqs[0].d) == (COMPLETE, WRITABLE)  # one writer
    d.msg("PrefillRelease", "Ack", 1)
    assert e.P.alloc.num_free == 2  # the source is freed only after the commit point
    d("DecodeStep", req=0)  # token 0 in place: logical block 0, slot 0
    assert torch.equal(e.replica(0, "d"), e.truth[0])
    assert not torch.equal(e.truth[0], e.frozen_truth[0])
    d("DecodeFinish", req=0)
    assert d.w.reqs[0].st == FINISHED
    assert_quiescent(e)


def test_offload_reload_round_trip_is_exact_and_waits_for_room() -> None:
    d = Drive(CONFIGS["offload_contend"])  # GPU 3 blocks, host 2, two 2-block requests
    e = d.eng
    d("PrefillAdmit", req=0)
    d("PrefillRun", req=0)
    d("PrefillDecodeStep", req=0)  # token 0 written in place (block 0, slot 0)
    assert e.P.alloc.blocks_of("r0") == (0, 1)
    d("PrefillOffloadBegin", req=0)
    assert e.H.alloc.blocks_of("r0") == (0, 1) and e.P.alloc.blocks_of("r0@store") == (0, 1)
    d.refused("PrefillDecodeStep", "FrozenSnapshot", req=0)  # the store reads the blocks
    d.refused("PrefillOffloadCommit", "PublishAfterCommit", req=0)  # nothing stored yet
    d("PrefillOffloadCopy", req=0)
    d.refused("PrefillReloadBegin", "LoadXorStore", req=0)
    d("PrefillOffloadCopy", req=0)
    d("PrefillOffloadCommit", req=0)
    assert torch.equal(e.replica(0, "h"), e.truth[0]) and e.P.alloc.num_free == 3
    d("PrefillAdmit", req=1)
    assert e.P.alloc.blocks_of("r1") == (2, 0)  # free list order: 2, then r0's 0, 1
    d("PrefillRun", req=1)
    d.refused("PrefillReloadBegin", "CapacityRefcount", req=0)  # 1 free block of 2
    d("PrefillFinish", req=1)
    d("PrefillReloadBegin", req=0)
    assert e.P.alloc.blocks_of("r0") == (1, 2)
    d.refused("PrefillReloadCommit", "NoPartialUse", req=0)
    d("PrefillReloadCopy", req=0)
    d("PrefillReloadCopy", req=0)
    d("PrefillReloadCommit", req=0)
    assert torch.equal(e.replica(0, "p"), e.truth[0])  # the token written before offload too
    assert e.H.alloc.num_free == 2 and d.w.reqs[0].p == WRITABLE
    d("PrefillDecodeStep", req=0)
    d("PrefillFinish", req=0)
    assert_quiescent(e)


def test_cancel_mid_transfer_quarantines_until_the_writer_quiesces() -> None:
    d = Drive(CONFIGS["handoff_tp2to1"])
    e = d.eng
    d("PrefillAdmit", req=0)
    d("PrefillRun", req=0)
    d("PrefillFreeze", req=0)
    d.msg("DecodeReserve", "Handoff", 1)
    d.msg("PrefillRecvReady", "Ready", 1)
    d("PrefillSendChunk", req=0)  # chunk 0 (rank 0, block 0 -> decode block 0) in flight
    d("ClientCancel", req=0)
    d("DecodeAbort", req=0)
    assert d.w.reqs[0].d == QUARANTINED and e.D.alloc.quarantined("r0") == (0, 1)
    assert e.D.alloc.num_free == 0  # not reusable while a write may land
    d.refused("PrefillQuiesce", "NoReuseUnderIO", req=0)  # its own write is in flight
    d.msg("DecodeReceiveChunk", "Chunk", 1, 0)  # lands in quarantine: harms nobody
    d("PrefillQuiesce", req=0)  # frees the source, tells decode
    assert e.P.alloc.num_free == 2
    d.msg("DecodeReclaim", "Quiesced", 1)
    d.msg("PrefillDiscard", "Nack", 1)
    assert_quiescent(e)


def test_full_prefix_hit_transfers_zero_blocks_and_still_completes() -> None:
    d = Drive(CONFIGS["prefix_share"])  # 1-block requests, the 1-block prefix cached
    e = d.eng
    assert e.prefix_blocks == (0,) and e.D.alloc.refcount(0) == 1
    d("PrefillAdmit", req=0)
    d("PrefillRun", req=0)
    d("PrefillFreeze", req=0)
    d.msg("DecodeReserve", "Handoff", 1)  # the content-hash chain matches: hit = 1
    assert e.D.alloc.blocks_of("r0") == () and e.D.alloc.blocks_of("r0#pfx") == (0,)
    assert e.D.alloc.refcount(0) == 2
    d.msg("PrefillRecvReady", "Ready", 1, 1)
    d("PrefillSendChunk", req=0)  # nothing to send but the RankDone
    assert [parse(t)["kind"] for t, _ in e.wire.entries("0>d")] == ["RankDone"]
    d.refused("DecodeEvictPrefix", "CapacityRefcount")  # r0 references it
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d("DecodeValidate", req=0)
    d("DecodeCommit", req=0)
    assert torch.equal(e.replica(0, "d"), e.truth[0])  # the shared block is r0's KV
    d.msg("PrefillRelease", "Ack", 1)
    d("DecodeStep", req=0)  # no private block to write: the spec grows no replica
    d("DecodeFinish", req=0)
    assert e.D.alloc.refcount(0) == 1
    d("DecodeEvictPrefix")
    assert e.prefix_blocks == () and e.D.alloc.num_free == 2
    assert_quiescent(e)


def test_prefill_crash_after_commit_keeps_the_request_on_decode() -> None:
    d = Drive(CONFIGS["handoff_crash"])  # TP 1 -> 2: each chunk lands on both decode ranks
    e = d.eng
    d("PrefillAdmit", req=0)
    d("PrefillRun", req=0)
    handoff_until_sent(d)
    for idx in (0, 1):
        d.msg("DecodeReceiveChunk", "Chunk", 1, idx)
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d("DecodeValidate", req=0)
    d("DecodeCommit", req=0)
    d("EnvCrash", worker="prefill")  # its pools and the Ack to it are gone
    assert d.w.reqs[0].st == RUNNING and not d.w.p_up and e.P.alloc.num_free == 2
    d("DecodeStep", req=0)
    d("DecodeFinish", req=0)
    assert_quiescent(e)


def test_decode_crash_mid_transfer_fails_closed_and_frees_the_source() -> None:
    d = Drive(CONFIGS["handoff_crash"])
    e = d.eng
    d("PrefillAdmit", req=0)
    d("PrefillRun", req=0)
    handoff_until_sent(d)
    d("EnvCrash", worker="decode")  # the writes and the RankDone die with it
    assert d.w.reqs[0].st == RUNNING and d.w.reqs[0].p == COMPLETE  # a copy is left
    d("PrefillTimeout", req=0)  # no Ack will come: fail, free, Quiesced vanishes
    assert d.w.reqs[0].st == FAILED
    assert_quiescent(e)
