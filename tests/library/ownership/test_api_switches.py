"""The API's bug switches (``refimpl.api.switches``) reproduce the two silent-corruption
bugs of issue #30: with each, the bytes the engine reads differ from the sent KV and no
error is raised; without it they are equal (``test_api_ownership_bugs``)."""

from __future__ import annotations

import pytest
import torch

from refimpl import Receiver, Sender, State, read_kv, write_kv
from refimpl.api.switches import (
    API_SWITCHES,
    FAILED_LOAD_KEEPS_HIT,
    FAILED_STORE_VISIBLE,
    FREE_QUARANTINE_EARLY,
    HEADS_OF_ANOTHER_RANK,
    LAYER_READY_ON_STAGING,
    PREFIX_UNREFERENCED,
    QUIESCED_AT_ABORT,
    QUIESCED_AT_NACK,
    RANK_ACCEPTS_DEAD_INCARNATION,
    READY_ON_OWN_INSTALL,
    RELEASE_BEFORE_INSTALL,
    SLICE_READ_AT_READY,
    STALE_INCARNATION_ACCEPTED,
    STREAM_READS_AT_READY,
)
from tests.library.lib_helpers import MODEL, Pair, geo, pair, prefill


def _drive(p: Pair, rounds: int = 20) -> None:
    for _ in range(rounds):
        p.rx.poll("r")
        p.tx.poll("r")


def test_the_switches_are_validated_by_name() -> None:
    p = pair(geo(), geo())
    known = (
        "known: \\['quiesced_at_abort', 'quiesced_at_nack', 'release_before_install', "
        "'stale_incarnation_accepted', 'stream_reads_at_ready'\\]"
    )
    with pytest.raises(ValueError, match=f"unknown mutants.*{known}"):
        Sender(p.src, p.tx.geometry, p.t, MODEL, mutants={LAYER_READY_ON_STAGING})
    with pytest.raises(ValueError, match="known: \\['free_quarantine_early', 'layer_ready_on_"):
        Receiver(p.dst, p.rx.geometry, p.t, MODEL, mutants={"no_such_bug"})
    with pytest.raises(ValueError, match="not a string"):
        Receiver(p.dst, p.rx.geometry, p.t, MODEL, mutants=LAYER_READY_ON_STAGING)
    assert API_SWITCHES == {
        LAYER_READY_ON_STAGING,
        STREAM_READS_AT_READY,
        STALE_INCARNATION_ACCEPTED,
        READY_ON_OWN_INSTALL,  # the rank switches (tests/library/tours/test_api_tour_ranks.py)
        HEADS_OF_ANOTHER_RANK,
        SLICE_READ_AT_READY,  # (tests/library/tours/test_api_tour_ranks_stream.py)
        RANK_ACCEPTS_DEAD_INCARNATION,  # (tests/library/tours/test_api_tour_ranks_restart.py)
        FREE_QUARANTINE_EARLY,  # unrevocable (tests/library/tours/test_api_tour_unrevocable.py)
        QUIESCED_AT_NACK,  # (the same)
        QUIESCED_AT_ABORT,  # (tests/library/tours/test_api_tour_quiesce.py)
        RELEASE_BEFORE_INSTALL,  # offload (tests/library/tours/test_api_tour_offload.py)
        FAILED_LOAD_KEEPS_HIT,  # DiskTier (tests/library/tours/test_api_tour_host_cache.py)
        FAILED_STORE_VISIBLE,  # (tests/library/tours/test_api_tour_disk_offload.py)
        PREFIX_UNREFERENCED,  # a decode-side prefix (tests/library/tours/test_api_tour_prefix.py)
    }


@pytest.mark.parametrize("mutant", [False, True])
def test_layer_ready_on_staging_reports_a_layer_the_target_blocks_do_not_hold(
    mutant: bool,
) -> None:
    p = pair(geo(), geo(block_size=8))  # a block-size change: layers land in staging
    mutants = {LAYER_READY_ON_STAGING} if mutant else set()
    p.rx = Receiver(p.dst, p.rx.geometry, p.t, MODEL, mutants=mutants)
    kv = prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)), layers=2)
    p.tx.send_layer("r", 0)
    _drive(p, rounds=3)
    assert p.rx.layer_ready("r", 0)  # what a connector's wait_for_layer_load waits on
    loaded = read_kv(p.dst, p.rx.held()["r"], 10, layer=0)  # what it then loads
    assert torch.equal(loaded, kv[0]) is not mutant  # the switch: zeros, no error
    p.tx.send_layer("r", 1)
    _drive(p)
    assert p.rx.state("r") is State.DONE  # it commits either way: the bug is silent


@pytest.mark.parametrize("mutant", [False, True])
def test_stream_reads_at_ready_ships_another_requests_bytes_sealed_as_this_ones(
    mutant: bool,
) -> None:
    p = pair(geo(), geo(), src_cap=3)
    p.tx = Sender(
        p.src, p.tx.geometry, p.t, MODEL, mutants={STREAM_READS_AT_READY} if mutant else ()
    )
    kv = prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)), layers=2, free_source=True)
    for layer in range(2):
        p.tx.send_layer("r", layer)
    other = p.src.alloc.allocate("x", 3) if p.src.alloc.free("r") else []
    x = torch.randn(2, 2, 4, 12, 8, generator=torch.Generator().manual_seed(9))
    write_kv(p.src, "x", other, [list(layer) for layer in x])
    _drive(p)
    assert p.rx.state("r") is State.DONE and p.tx.state("r") is State.DONE  # no error
    got = read_kv(p.dst, p.rx.result("r").blocks, 10)
    assert torch.equal(got, kv) is not mutant
    if mutant:
        assert torch.equal(got, x[:, :, :, :10])  # request x's KV, committed as r's
