"""TP ranks each with their own registered caches (``RankSender`` / ``RankReceiver``):
TP 2 -> 1 and 1 -> 2, block size 4 -> 8, a decode-side prefix, bit-exact in each decode
rank's own tensors (read by plain indexing, ``reg_helpers``), 0 bytes written outside the
scheduler's blocks, and every block freeable once the request is done. A prefill rank
that sends a narrower decode rank its slice of its heads reads them through a view of
its caches: no kvown pool is built on the prefill side (counted), and on the decode side
only the block-size change's staging, which is gone once the request committed."""

from __future__ import annotations

import pytest
import torch
from reg_helpers import KINDS, MODEL, Kind, changed, fill, make, snapshot, tokens_of

from refimpl.api import State
from refimpl.api.ranks import Epochs, RankReceiver, RankSender
from refimpl.memory import register_kv_caches
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import Census

TOKENS = list(range(200, 220))  # 20 tokens: 5 source blocks of 4, 3 decode blocks of 8
SRC_IDS, DST_IDS = [9, 2, 5, 0, 7], [4, 11, 1]  # the schedulers' (one table per side)
RID, HEADS = "r", 4
FA, FI, FA_CROSS = KINDS[0], KINDS[2], KINDS[4]


def _handoff(kind: Kind, src_tp: int, dst_tp: int, prefix: int, mp: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    census = Census(mp)
    gs, gd = kind.geometry(4, tp=src_tp), kind.geometry(8, tp=dst_tp)
    t, epochs = InProcessTransport(), Epochs()
    sc = [make(kind, 12, 4, HEADS // src_tp) for _ in range(src_tp)]
    dc = [make(kind, 12, 8, HEADS // dst_tp) for _ in range(dst_tp)]
    for r, c in enumerate(sc):
        fill(kind, c, SRC_IDS, seed=30 + r)
    want = torch.cat([tokens_of(kind, c, SRC_IDS, len(TOKENS)) for c in sc], dim=3)  # heads
    ps = [register_kv_caches(gs.rank_view(r), c, kind.name, cross_layer=kind.cross)
          for r, c in enumerate(sc)]  # fmt: skip
    pd = [register_kv_caches(gd.rank_view(d), c, kind.name, cross_layer=kind.cross)
          for d, c in enumerate(dc)]  # fmt: skip
    h = HEADS // dst_tp
    for d, c in enumerate(dc):  # the decode engines' own prefix hit: its first block(s)
        for li in range(3):
            for k in range(prefix):
                kind.read(c, li, DST_IDS[k]).copy_(
                    want[li, :, 8 * k : 8 * (k + 1), d * h : (d + 1) * h]
                )
        pd[d].adopt("cached", DST_IDS[:prefix])
    before = [snapshot(kind, c) for c in dc]
    txs = [RankSender(p, gs, t, MODEL, rank=r, dst_tp=dst_tp, epochs=epochs)
           for r, p in enumerate(ps)]  # fmt: skip
    rxs = [RankReceiver(p, gd, t, MODEL, rank=d, src_tp=src_tp) for d, p in enumerate(pd)]
    epochs.open(RID)
    for rx in rxs:
        hit = {"prefix": DST_IDS[:prefix], "prefix_tokens": TOKENS[: 8 * prefix]} if prefix else {}
        rx.expect(RID, blocks=DST_IDS[prefix:], **hit)
    for p, tx in zip(ps, txs, strict=True):
        p.adopt(RID, SRC_IDS)
        tx.offer(RID, TOKENS, blocks=SRC_IDS, prefix_blocks=2 * prefix)
    for layer in range(3):
        for tx in txs:
            tx.send_layer(RID, layer)
    for _ in range(20):
        for x in [*rxs, *txs]:
            x.poll(RID)
    return census, dc, ps, pd, txs, rxs, want, before


@pytest.mark.parametrize("prefix", [0, 1], ids=["whole", "prefix"])
@pytest.mark.parametrize("tps", [(2, 1), (1, 2)], ids=["tp2to1", "tp1to2"])
@pytest.mark.parametrize("kind", [FA, FI, FA_CROSS], ids=str)
def test_rank_groups_on_registered_caches(
    kind: Kind, tps: tuple[int, int], prefix: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    src_tp, dst_tp = tps
    census, dc, ps, pd, txs, rxs, want, before = _handoff(kind, src_tp, dst_tp, prefix, monkeypatch)
    assert [tx.state(RID) for tx in txs] == [State.DONE] * src_tp
    assert all(rx.ready(RID) for rx in rxs)
    h = HEADS // dst_tp
    for d, c in enumerate(dc):  # each decode rank's own heads, in its own tensors
        got = tokens_of(kind, c, DST_IDS, len(TOKENS))
        assert torch.equal(got, want[:, :, :, d * h : (d + 1) * h])
        assert changed(kind, c, before[d]) == sorted(DST_IDS[prefix:])  # nothing elsewhere
        assert rxs[d].blocks(RID) == tuple(DST_IDS)  # the prefix hit, then its own
    for p in ps:  # acked: the prefill blocks are the engine's to free
        assert p.freeable(RID) == tuple(SRC_IDS) and p.release(RID) == tuple(SRC_IDS)
    assert census.kvown_pools() == 0  # no kvown pool: the slices are views
    # block size 4 -> 8: each decode rank stages one pool per prefill rank it hears
    assert len(census.built) == src_tp * dst_tp
    assert census.alive() == 0  # dropped at the commit


def test_a_narrower_decode_ranks_slice_is_a_view_of_the_engines_tensor() -> None:
    """TP 1 -> 2: each decode rank's slice of the prefill rank's heads is read from the
    engine's own tensor (the same storage), not from a copy."""
    gs = FA.geometry(4, tp=1)
    sc = make(FA, 12, 4, HEADS)
    ps = register_kv_caches(gs, sc, "flash_attn")
    tx = RankSender(ps, gs, InProcessTransport(), MODEL, rank=0, dst_tp=2, epochs=Epochs())
    subs = [sp for _, _, sp in tx._subs.values()]  # noqa: SLF001
    engine = sc[0].untyped_storage().data_ptr()  # type: ignore[index]
    assert len(subs) == 2 and all(sp is not None for sp in subs)
    assert {sp.pools[0].layer(0).untyped_storage().data_ptr() for sp in subs if sp} == {engine}
    assert [sp.pools[0].layer(0).shape[3] for sp in subs if sp] == [2, 2]  # 2 heads each
