"""Every incident of incidents.md and every failure of the seed, on the engine.

The correct engine refuses the buggy step (naming the property) or survives it with
nothing lost: no leaked block, committed bytes equal to the truth, integrity after every
step. With the matching mutant switched on, the same events do real damage: foreign bytes
in another request's block, a partial or stale replica, a leak, or the broken property on
``abstract()``.
"""

from __future__ import annotations

import pytest
import torch

from refimpl.checksum import byte_view, tensor_from_bytes
from refimpl.errors import ManifestError, OwnershipError
from spec.config import CONFIGS, Config
from spec.properties import violated_safety
from spec.state import AWAIT_READY, FAILED, M_NACK, NONE, SENDING, WRITABLE, msg
from tests.refimpl.engine_helpers import Drive, assert_quiescent

TWO_ONE_BLOCK = Config(
    name="two_one_block",
    doc="two 1-block requests, one decode block: an aborted attempt's blocks are wanted",
    n_reqs=2,
    blocks=1,
    cap_p=2,
    cap_d=1,
    max_attempts=1,
)


def start(d: Drive, req: int = 0, sends: int = 1) -> None:
    """Admit, prefill, freeze, reserve, ready, then ``sends`` items sent."""
    for a in ("PrefillAdmit", "PrefillRun", "PrefillFreeze"):
        d(a, req=req)
    d.msg("DecodeReserve", "Handoff", 1, req=req)
    d.msg("PrefillRecvReady", "Ready", 1, req=req)
    for _ in range(sends):
        d("PrefillSendChunk", req=req)


def finish_handoff(d: Drive, req: int, chunks: int, ranks: int, epoch: int = 1) -> None:
    """Deliver every chunk and RankDone of ``epoch``, validate, commit, release."""
    if d.w.reqs[req].ps == AWAIT_READY:
        d.msg("PrefillRecvReady", "Ready", epoch, req=req)
    while d.w.reqs[req].ps == SENDING:
        d("PrefillSendChunk", req=req)
    for idx in range(chunks):
        d.msg("DecodeReceiveChunk", "Chunk", epoch, idx, req=req)
    for rank in range(ranks):
        d.msg("DecodeReceiveDone", "RankDone", epoch, rank, req=req)
    d("DecodeValidate", req=req)
    d("DecodeCommit", req=req)
    d.msg("PrefillRelease", "Ack", epoch, req=req)


# ---------------------------------------------------------------- incidents.md
@pytest.mark.parametrize("bug", [False, True])
def test_vllm_32255_abort_under_an_in_flight_write(bug: bool) -> None:
    d = Drive(TWO_ONE_BLOCK, frozenset({"free_on_cancel_in_flight"} if bug else ()), strict=not bug)
    e = d.eng
    start(d, req=0)  # A's chunk 0 is on its way to decode block 0
    d("ClientCancel", req=0)
    d("DecodeAbort", req=0)
    for a in ("PrefillAdmit", "PrefillRun", "PrefillFreeze"):
        d(a, req=1)
    if not bug:
        assert e.D.alloc.quarantined("r0") == (0,)
        d.refused("DecodeReserve", "CapacityRefcount", req=1, msg="Handoff", epoch=1, idx=0)
        d.msg("DecodeReceiveChunk", "Chunk", 1, 0, req=0)  # A's write lands in quarantine
        d("PrefillQuiesce", req=0)
        d.msg("DecodeReclaim", "Quiesced", 1, req=0)
        d.msg("PrefillDiscard", "Nack", 1, req=0)
        d.msg("DecodeReserve", "Handoff", 1, req=1)
        assert e.D.alloc.blocks_of("r1") == (0,)
        finish_handoff(d, 1, chunks=1, ranks=1)
        d("DecodeFinish", req=1)
        assert_quiescent(e)
        return
    assert e.D.alloc.num_free == 1  # freed at once, under A's write
    d.msg("DecodeReserve", "Handoff", 1, req=1)
    assert e.D.alloc.blocks_of("r1") == (0,)  # C gets A's block
    finish_handoff(d, 1, chunks=1, ranks=1)
    assert e.damaged() == []
    d.msg("DecodeReceiveChunk", "Chunk", 1, 0, req=0)  # A's late write lands in C's block
    assert e.damaged() == ["r1@d"]
    assert "NoReuseUnderIO" in violated_safety(e.abstract(), d.c)


@pytest.mark.parametrize("bug", [False, True])
def test_sglang_30233_a_truncated_transfer_is_never_success(bug: bool) -> None:
    d = Drive(CONFIGS["handoff_tp2to1"], frozenset({"partial_as_complete"} if bug else ()))
    d.strict = not bug
    start(d, sends=6)
    d.msg("EnvLose", "Chunk", 1, 1)  # rank 0's block 1 never arrives
    for idx in (0, 2, 3):
        d.msg("DecodeReceiveChunk", "Chunk", 1, idx)
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d.msg("DecodeReceiveDone", "RankDone", 1, 1)  # every rank says "done"
    if bug:
        d("DecodeValidate", req=0)
        d("DecodeCommit", req=0)
        assert d.eng.damaged() == ["r0@d"]  # one head of block 1 is unwritten
        return
    d.refused("DecodeValidate", "NoPartialUse", req=0)
    d("DecodeTimeout", req=0)  # decode gives the attempt up: fence, free, Nack
    d.msg("PrefillResume", "Nack", 1)  # the source thaws; a new epoch retries
    d("PrefillFreeze", req=0)
    d.msg("DecodeReserve", "Handoff", 2)
    d.msg("PrefillRecvReady", "Ready", 2)
    finish_handoff(d, 0, chunks=4, ranks=2, epoch=2)
    d("DecodeFinish", req=0)
    assert_quiescent(d.eng)


def test_a_corrupted_chunk_is_caught_by_its_checksum_and_the_attempt_retried() -> None:
    d = Drive(CONFIGS["handoff_tp2to1"])
    e = d.eng
    start(d, sends=6)
    d.msg("EnvCorrupt", "Chunk", 1, 1)  # one byte of rank 0's block 1 flipped in transit
    d.msg("DecodeReceiveChunk", "ChunkCorrupt", 1, 1)  # refused by its checksum
    assert torch.equal(e.D.pools[0].kv[1], torch.zeros_like(e.D.pools[0].kv[1]))
    d.msg("DecodeReceiveChunk", "Chunk", 1, 0)
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d.msg("DecodeReceiveDone", "RankDone", 1, 1)
    d.refused("DecodeValidate", "NoPartialUse", req=0)
    d("DecodeAbort", req=0)  # invalid: fence the attempt (chunks 2, 3 fail), free, Nack
    assert e.D.alloc.num_free == 2 and d.w.reqs[0].net == (msg(M_NACK, 1),)
    d.msg("PrefillResume", "Nack", 1)
    d("PrefillFreeze", req=0)
    d.msg("DecodeReserve", "Handoff", 2)
    finish_handoff(d, 0, chunks=4, ranks=2, epoch=2)
    d("DecodeFinish", req=0)
    assert_quiescent(e)


def test_trtllm_6507_the_layout_travels_in_the_manifest() -> None:
    d = Drive(CONFIGS["handoff_tp2to1"])
    e = d.eng
    start(d, sends=0)
    finish_handoff(d, 0, chunks=4, ranks=2)
    # kv_heads == block_size == 2: both layouts have one shape, so shape cannot tell them
    # apart. Installing the sender's heads_major bytes as if they were tokens_major is
    # silently wrong; the engine permutes by the manifest's layout and is exact.
    truth = e.truth[0]
    assert torch.equal(e.replica(0, "d"), truth)
    raw = bytes(byte_view(truth[0].contiguous()))
    misread = tensor_from_bytes(raw, torch.float16, (2, 2, 2, 2, 4)).transpose(2, 3)
    assert e.D.pools[0].kv[0].shape == misread.shape and not torch.equal(misread, truth[0])


@pytest.mark.parametrize("bug", [False, True])
def test_manifest_mismatch_is_refused_with_its_reason(bug: bool) -> None:
    d = Drive(CONFIGS["handoff_tp2to1"], frozenset({"mismatch_installed"} if bug else ()))
    d("PrefillAdmit", req=0)
    d("PrefillRun", req=0)
    d("PrefillFreeze", req=0)
    d.msg("EnvManifestMismatch", "Handoff", 1)  # another RoPE theta than decode runs
    d.msg("DecodeReserve", "HandoffBadManifest", 1)
    d.msg("PrefillRecvReady", "Ready", 1)
    finish = [("DecodeReceiveChunk", "Chunk", k) for k in range(4)]
    for _ in range(6):
        d("PrefillSendChunk", req=0)
    for a, kind, idx in finish:
        d.msg(a, kind, 1, idx)
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d.msg("DecodeReceiveDone", "RankDone", 1, 1)
    if bug:
        d("DecodeValidate", req=0)
        assert "ManifestGate" in violated_safety(d.w, d.c)
        return
    err = d.refused("DecodeValidate", "ManifestGate", req=0)
    assert isinstance(err, ManifestError) and any("rope.theta" in r for r in err.reasons)
    d("DecodeAbort", req=0)  # every chunk landed: freed at once, Nack
    d.msg("PrefillResume", "Nack", 1)
    d("PrefillFreeze", req=0)
    d.msg("DecodeReserve", "Handoff", 2)
    d.msg("PrefillRecvReady", "Ready", 2)
    finish_handoff(d, 0, chunks=4, ranks=2, epoch=2)
    d("DecodeFinish", req=0)
    assert_quiescent(d.eng)


def test_vllm_46240_load_and_store_never_overlap_and_completions_are_idempotent() -> None:
    d = Drive(CONFIGS["offload_contend"])
    for a in ("PrefillAdmit", "PrefillRun", "PrefillOffloadBegin", "PrefillOffloadCopy"):
        d(a, req=0)
    d.refused("PrefillReloadBegin", "LoadXorStore", req=0)
    d2 = Drive(CONFIGS["handoff_tp2to1"])  # a duplicated completion is handled once
    start(d2, sends=0)
    while d2.w.reqs[0].ps == SENDING:
        d2("PrefillSendChunk", req=0)
    for idx in range(4):
        d2.msg("DecodeReceiveChunk", "Chunk", 1, idx)
    d2.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d2.msg("EnvDuplicate", "RankDone", 1, 1)
    d2.msg("DecodeReceiveDone", "RankDone", 1, 1)
    d2.msg("DecodeReceiveDone", "RankDone", 1, 1)  # counted once: a set of ranks
    d2("DecodeValidate", req=0)
    d2("DecodeCommit", req=0)
    d2.msg("PrefillRelease", "Ack", 1)
    d2("DecodeFinish", req=0)
    assert_quiescent(d2.eng)


@pytest.mark.parametrize("bug", [False, True])
def test_lmcache_4991_a_failed_store_never_becomes_visible(bug: bool) -> None:
    d = Drive(CONFIGS["offload_contend"], frozenset({"failed_store_visible"} if bug else ()))
    d.strict = not bug
    for a in ("PrefillAdmit", "PrefillRun", "PrefillOffloadBegin", "PrefillOffloadCopy"):
        d(a, req=0)
    d("EnvStoreFail", req=0)  # block 1 was never stored
    if bug:
        assert d.eng.damaged() == ["r0@h"]  # a half-written copy is published
        for a in ("PrefillReloadBegin", "PrefillReloadCopy", "PrefillReloadCopy"):
            d(a, req=0)
        d("PrefillReloadCommit", req=0)
        assert d.eng.damaged() == ["r0@p"]  # ... and decodes from garbage
        return
    assert (d.w.reqs[0].h, d.w.reqs[0].p) == (NONE, WRITABLE) and d.eng.H.alloc.num_free == 2
    d.refused("PrefillReloadBegin", None, req=0)  # nothing to reload from
    d("PrefillDecodeStep", req=0)  # the GPU copy thawed
    d("PrefillFinish", req=0)
    assert_quiescent(d.eng)


@pytest.mark.parametrize("bug", [False, True])
def test_vllm_29870_a_store_keeps_its_source_blocks(bug: bool) -> None:
    d = Drive(CONFIGS["offload_contend"], frozenset({"preempt_during_store"} if bug else ()))
    d.strict = not bug
    for a in ("PrefillAdmit", "PrefillRun", "PrefillOffloadBegin", "PrefillOffloadCopy"):
        d(a, req=0)
    if not bug:
        d.refused("PrefillPreempt", "NoReuseUnderIO", req=0)
        return
    d("PrefillPreempt", req=0)  # frees blocks 0, 1 while the store still reads block 1
    d("PrefillAdmit", req=1)
    d("PrefillRun", req=1)
    assert d.eng.P.alloc.owner(0) == "r1" and d.eng.H.alloc.blocks_of("r0") == (0, 1)
    assert "NoReuseUnderIO" in violated_safety(d.w, d.c)


@pytest.mark.parametrize("bug", [False, True])
def test_sglang_31800_a_filling_attempt_has_a_bounded_exit(bug: bool) -> None:
    d = Drive(CONFIGS["handoff_crash"], frozenset({"no_timeout_while_filling"} if bug else ()))
    start(d, sends=1)
    d.msg("DecodeReceiveChunk", "Chunk", 1, 0)  # FILLING; the rest never comes
    if bug:
        d.refused("DecodeTimeout", None, req=0)  # decode alone cannot let go
        d.refused("DecodeAbort", None, req=0)
        assert d.eng.D.alloc.num_free == 0
        return
    d("DecodeTimeout", req=0)  # fence the attempt, free, Nack
    assert d.eng.D.alloc.num_free == 2
    d("PrefillSendChunk", req=0)  # a late write of the fenced attempt fails harmlessly
    d.msg("DecodeReceiveChunk", "Chunk", 1, 1)
    assert d.eng.D.alloc.num_free == 2


# ---------------------------------------------------------------- the seed's failures
RELEASE_CFG = Config(name="release", doc="one prefill block", n_reqs=2, blocks=1, cap_p=1)


@pytest.mark.parametrize("bug", [False, True])
def test_seed_source_frees_before_the_target_installs(bug: bool) -> None:
    d = Drive(RELEASE_CFG, frozenset({"release_before_install"} if bug else ()), strict=not bug)
    e = d.eng
    start(d, sends=2)  # chunk and RankDone posted
    if not bug:
        assert e.P.alloc.refcount(0) == 2  # still pinned: the chunk reads it
        d.refused("PrefillAdmit", "CapacityRefcount", req=1)
        finish_handoff(d, 0, chunks=1, ranks=1)
        return
    assert e.P.alloc.num_free == 1 and "NothingLost" in violated_safety(d.w, d.c)
    e.PrefillAdmit(1)
    e.PrefillRun(1)  # r1's KV overwrites block 0 under r0's in-flight write
    e.DecodeReceiveChunk(0, "ChunkCorrupt", 1, 0)  # it now carries r1's bytes
    e.DecodeReceiveDone(0, "RankDone", 1, 0)
    with pytest.raises(OwnershipError) as err:
        e.DecodeValidate(0)
    assert err.value.prop == "NoPartialUse"  # caught by the checksum, but r0 is lost


def test_seed_source_and_target_never_both_write() -> None:
    d = Drive(CONFIGS["handoff_tp2to1"])
    start(d, sends=6)
    d.refused("PrefillDecodeStep", "FrozenSnapshot", req=0)
    for idx in range(4):
        d.msg("DecodeReceiveChunk", "Chunk", 1, idx)
    d("PrefillTimeout", req=0)  # no word from decode: the request fails, no thaw
    assert d.w.reqs[0].st == FAILED and d.w.reqs[0].p == NONE
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d.msg("DecodeReceiveDone", "RankDone", 1, 1)
    d.refused("DecodeValidate", "StickyEnd", req=0)
    d("DecodeAbort", req=0)
    d.msg("DecodeDiscard", "Quiesced", 1)
    d.msg("PrefillDiscard", "Nack", 1)
    assert_quiescent(d.eng)


def test_seed_two_writers_diverge_with_the_thaw_bug() -> None:
    d = Drive(CONFIGS["handoff_tp2to1"], frozenset({"source_resumes_on_timeout"}), strict=False)
    e = d.eng
    start(d, sends=6)
    for idx in range(4):
        d.msg("DecodeReceiveChunk", "Chunk", 1, idx)
    d("PrefillTimeout", req=0)  # thaws the source without a Nack
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d.msg("DecodeReceiveDone", "RankDone", 1, 1)
    d("DecodeValidate", req=0)
    d("DecodeCommit", req=0)
    assert "SingleWriter" in violated_safety(d.w, d.c)
    d("PrefillDecodeStep", req=0)  # token 0 on prefill
    d("DecodeStep", req=0)  # token 1 on decode
    assert not torch.equal(e.replica(0, "p"), e.replica(0, "d"))
    assert e.damaged()


@pytest.mark.parametrize("bug", [False, True])
def test_seed_cancel_interrupts_the_transfer(bug: bool) -> None:
    d = Drive(CONFIGS["handoff_tp2to1"], frozenset({"cancel_ignored"} if bug else ()))
    start(d, sends=6)
    d("ClientCancel", req=0)
    for idx in range(4):
        d.msg("DecodeReceiveChunk", "Chunk", 1, idx)
    d.msg("DecodeReceiveDone", "RankDone", 1, 0)
    d.msg("DecodeReceiveDone", "RankDone", 1, 1)
    if bug:
        d("DecodeValidate", req=0)
        d("DecodeCommit", req=0)
        assert "StickyEnd" in violated_safety(d.w, d.c)
        return
    d.refused("DecodeValidate", "StickyEnd", req=0)
    d("DecodeAbort", req=0)  # all landed: freed at once
    d("PrefillQuiesce", req=0)
    d.msg("DecodeDiscard", "Quiesced", 1)
    d.msg("PrefillDiscard", "Nack", 1)
    assert_quiescent(d.eng)


def test_seed_reload_on_the_critical_stream_is_a_cuda_only_switch() -> None:
    d = Drive(CONFIGS["offload_contend"], frozenset({"reload_on_critical_stream"}))
    assert d.eng.stream_switch_applicable == torch.cuda.is_available()
    for a in ("PrefillAdmit", "PrefillRun", "PrefillOffloadBegin"):
        d(a, req=0)
    for a in ("PrefillOffloadCopy", "PrefillOffloadCopy", "PrefillOffloadCommit"):
        d(a, req=0)
    for a in ("PrefillReloadBegin", "PrefillReloadCopy", "PrefillReloadCopy"):
        d(a, req=0)
    d("PrefillReloadCommit", req=0)  # bytes exact either way; only the stream differs
    assert d.w.reqs[0].p == WRITABLE
