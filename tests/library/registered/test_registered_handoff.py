"""A handoff between an engine's own registered caches (``refimpl.memory``): the engine's
tensors in vLLM's layouts, the scheduler's block ids on both sides, bit-exact, and when
kvown says each block may be freed.

Every layout (FlashAttention, FlashInfer, NHD and HND, per layer and cross-layer) hands
off to the same layout, whole blocks and layer by layer; NHD per-layer to a FlashInfer
cross-layer cache and to an HND cache (another layout: one permuted copy), and block
size 4 -> 8 (staged). The bytes are read back from the engine's tensors by plain
indexing (``reg_helpers``), and every block outside the scheduler's ids is compared
with its bytes before the handoff: 0 written there.
"""

from __future__ import annotations

import pytest
import torch
from reg_helpers import KINDS, MODEL, Kind, N, changed, fill, make, snapshot, tokens_of

from refimpl.api import Receiver, Sender, State, channels, handoff
from refimpl.errors import InUseError
from refimpl.memory import register_kv_caches
from refimpl.transport import InProcessTransport

TOKENS = list(range(100, 110))  # 10 tokens: 3 blocks of 4 (the last one partial)
SRC_IDS, DST_IDS = [9, 2, 5], [0, 11, 6]  # engine-chosen, neither sorted nor contiguous


def _sides(src: Kind, dst: Kind, dst_bs: int = 4, n_dst: int = N):  # type: ignore[no-untyped-def]
    sc, dc = make(src), make(dst, n_dst, dst_bs)
    gs, gd = src.geometry(), dst.geometry(dst_bs)
    ps = register_kv_caches(gs, sc, src.name, cross_layer=src.cross)
    pd = register_kv_caches(gd, dc, dst.name, cross_layer=dst.cross)
    t = InProcessTransport()
    return sc, dc, ps, pd, t, Sender(ps, gs, t, MODEL), Receiver(pd, gd, t, MODEL)


@pytest.mark.parametrize("layered", [False, True], ids=["blocks", "layered"])
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_registered_to_registered_is_bit_exact_in_the_engines_blocks(
    kind: Kind, layered: bool
) -> None:
    sc, dc, ps, pd, _, tx, rx = _sides(kind, kind)
    fill(kind, sc, SRC_IDS, seed=1)
    before = snapshot(kind, dc)
    ps.adopt("r", SRC_IDS)
    res = handoff(
        tx, rx, "r", TOKENS, blocks=SRC_IDS, dst_blocks=DST_IDS, free_source=False, layered=layered
    )
    assert res.received.blocks == tuple(DST_IDS)
    want = tokens_of(kind, sc, SRC_IDS, len(TOKENS))
    assert torch.equal(tokens_of(kind, dc, DST_IDS, len(TOKENS)), want)
    assert changed(kind, dc, before) == sorted(DST_IDS)  # nothing written elsewhere
    assert ps.freeable("r") == tuple(SRC_IDS) and pd.freeable("r") == tuple(DST_IDS)
    assert ps.release("r") == tuple(SRC_IDS) and pd.release("r") == tuple(DST_IDS)
    assert ps.alloc.counts()["free"] == pd.alloc.counts()["free"] == N


FA, FA_HND, FI_CROSS = KINDS[0], KINDS[1], KINDS[4]


@pytest.mark.parametrize(
    ("src", "dst", "dst_bs"),
    [
        (FA, FI_CROSS, 4),
        (FA, KINDS[2], 4),
        (FA_HND, KINDS[3], 4),
        (FA, KINDS[4], 8),
        (KINDS[2], FA, 8),
    ],
    ids=[
        "fa-to-flashinfer-cross",
        "fa-to-flashinfer",
        "hnd-to-hnd",
        "bs4-to-bs8-cross",
        "fi-bs4-to-fa-bs8",
    ],
)
def test_across_layouts_and_block_sizes(src: Kind, dst: Kind, dst_bs: int) -> None:
    sc, dc, ps, pd, _, tx, rx = _sides(src, dst, dst_bs)
    fill(src, sc, SRC_IDS, seed=2)
    before = snapshot(dst, dc)
    ps.adopt("r", SRC_IDS)
    dst_ids = DST_IDS if dst_bs == 4 else [7, 3]  # 10 tokens in 2 blocks of 8
    handoff(tx, rx, "r", TOKENS, blocks=SRC_IDS, dst_blocks=dst_ids, free_source=False)
    assert torch.equal(tokens_of(dst, dc, dst_ids, 10), tokens_of(src, sc, SRC_IDS, 10))
    assert changed(dst, dc, before) == sorted(dst_ids)
    assert pd.freeable("r") == tuple(dst_ids)


def test_hnd_to_nhd_is_one_permuted_copy() -> None:
    sc, dc, ps, pd, _, tx, rx = _sides(FA_HND, FA)
    fill(FA_HND, sc, SRC_IDS, seed=3)
    before = snapshot(FA, dc)
    ps.adopt("r", SRC_IDS)
    handoff(tx, rx, "r", TOKENS, blocks=SRC_IDS, dst_blocks=DST_IDS, free_source=False)
    assert torch.equal(tokens_of(FA, dc, DST_IDS, 10), tokens_of(FA_HND, sc, SRC_IDS, 10))
    assert changed(FA, dc, before) == sorted(DST_IDS)


def test_blocks_are_freeable_only_once_acked_and_committed() -> None:
    """Source: pinned from the offer until the sender read the ack (vLLM's delayed free),
    also after the receiver committed. Destination: reserved until the commit."""
    sc, _, ps, pd, _, tx, rx = _sides(FA, FA)
    fill(FA, sc, SRC_IDS, seed=4)
    ps.adopt("r", SRC_IDS)
    rx.expect("r", blocks=DST_IDS)
    tx.offer("r", TOKENS, blocks=SRC_IDS)
    assert ps.freeable("r") == ()  # pinned by the offer
    rx.poll("r")  # manifest -> reserved, ready
    assert pd.freeable("r") == ()
    with pytest.raises(InUseError, match=r"0 \(reserved\), 6 \(reserved\), 11 \(reserved\)"):
        pd.release("r")
    tx.poll("r")  # ready -> every chunk sent
    assert tx.state("r") is State.SENDING and ps.freeable("r") == ()
    with pytest.raises(InUseError, match="pinned by a transfer"):
        ps.release("r")
    rx.poll("r")  # chunks -> installed, verified, committed, ack sent
    assert rx.state("r") is State.DONE and pd.freeable("r") == tuple(DST_IDS)
    assert ps.freeable("r") == ()  # committed there, but the ack is not read here yet
    tx.poll("r")
    assert tx.state("r") is State.DONE and ps.freeable("r") == tuple(SRC_IDS)
    assert ps.release("r") == tuple(SRC_IDS)


@pytest.mark.parametrize("how", ["lost-chunk-then-cancel", "corrupt-chunk", "sender-abort"])
def test_a_failed_handoff_writes_nothing_outside_the_given_blocks(how: str) -> None:
    sc, dc, ps, pd, t, tx, rx = _sides(FA, FA)
    fill(FA, sc, SRC_IDS, seed=5)
    before = snapshot(FA, dc)
    ps.adopt("r", SRC_IDS)
    rx.expect("r", blocks=DST_IDS)
    ch = channels("r").to_receiver
    if how == "lost-chunk-then-cancel":
        t.inject(ch, "lose", skip=2)  # the manifest and block 0 arrive, block 1 does not
    elif how == "corrupt-chunk":
        t.inject(ch, "corrupt", skip=2)
    tx.offer("r", TOKENS, blocks=SRC_IDS)
    rx.poll("r")
    if how == "sender-abort":
        tx.abort("r", "cancelled")
    else:
        tx.poll("r")
    rx.poll("r")
    if how == "lost-chunk-then-cancel":
        assert rx.state("r") is State.RECEIVING  # block 1 never comes: the scheduler cancels
        rx.abort("r", "cancelled")
    assert rx.state("r") is State.ABORTED
    assert set(changed(FA, dc, before)) <= set(DST_IDS)  # 0 blocks written elsewhere
    if how == "sender-abort":
        assert changed(FA, dc, before) == []  # nothing had landed
    assert pd.freeable("r") == tuple(DST_IDS)  # the writer stopped: given back at once
    tx.poll("r")
    assert tx.state("r").final and ps.freeable("r") == tuple(SRC_IDS)
    assert pd.release("r") == tuple(DST_IDS) and pd.alloc.counts()["free"] == N


def test_a_refused_manifest_touches_no_destination_block() -> None:
    sc, dc, ps, pd, _, tx, rx = _sides(FA, FA)
    fill(FA, sc, SRC_IDS, seed=6)
    before = snapshot(FA, dc)
    ps.adopt("r", SRC_IDS)
    pd.adopt("other", [6])  # the scheduler gave block 6 to another request too
    with pytest.raises(InUseError, match="6 owned by 'other'"):
        handoff(tx, rx, "r", TOKENS, blocks=SRC_IDS, dst_blocks=DST_IDS, free_source=False)
    assert rx.state("r") is State.REFUSED and changed(FA, dc, before) == []
    assert pd.alloc.blocks_of("r") == () and pd.freeable("r") == ()
    with pytest.raises(Exception, match=r"2 destination blocks given for 10 tokens \(3 blocks"):
        handoff(tx, rx, "r", TOKENS, blocks=SRC_IDS, dst_blocks=[0, 11], free_source=False)
    assert changed(FA, dc, before) == [] and ps.freeable("r") == tuple(SRC_IDS)
    assert pd.alloc.counts() == {"free": N - 1, "reserved": 0, "owned": 1, "quarantined": 0}


def test_tp2_registered_ranks_to_tp1() -> None:
    """Two TP ranks' caches registered in one process (``ranks=``), to one rank's."""
    g2, g1 = FA.geometry(tp=2), FA.geometry()
    halves = [make(FA, heads=2), make(FA, heads=2)]
    for r, c in enumerate(halves):
        fill(FA, c, SRC_IDS, seed=10 + r)
    dc = make(FA)
    ps = register_kv_caches(g2, layout="flash_attn", ranks=halves)
    pd = register_kv_caches(g1, dc, "flash_attn")
    t = InProcessTransport()
    ps.adopt("r", SRC_IDS)
    handoff(
        Sender(ps, g2, t, MODEL),
        Receiver(pd, g1, t, MODEL),
        "r",
        TOKENS,
        blocks=SRC_IDS,
        dst_blocks=DST_IDS,
        free_source=False,
    )
    want = torch.cat([tokens_of(FA, c, SRC_IDS, 10) for c in halves], dim=3)  # heads axis
    assert torch.equal(tokens_of(FA, dc, DST_IDS, 10), want)
