"""Regressions of the seven ownership bugs an engine author found in the public API
(issue #30, "Why" 1-7), each through ``Sender``/``Receiver`` alone. Each test failed on
main before its fix: (1) ``layer_ready`` while the layer sat only in staging, (2) a
streamed offer read its blocks at the receiver's ready, (3) one rank's abort reached no
sibling, (4) ranks picked their epochs alone, (6) no ``Sender.forget``, (7) ``result()``
answered freed block ids. (5), DistTransport's late chunks, is in
``test_api_dist_late.py`` (two processes)."""

from __future__ import annotations

import pytest
import torch

from refimpl import Receiver, Sender, State, read_kv, write_kv, write_kv_layer
from refimpl.errors import InUseError, StaleError
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import MODEL, Pair, geo, held, pair, prefill


def _drive(p: Pair, rid: str = "r", rounds: int = 20) -> None:
    for _ in range(rounds):
        p.rx.poll(rid)
        p.tx.poll(rid)


# ---------------------------------------------------------------- 1: layer_ready means landed
@pytest.mark.parametrize("dst_kw", [{"block_size": 8}, {"block_size": 2}], ids=["bs8", "bs2"])
def test_a_ready_layer_is_in_the_blocks_held_names_despite_a_block_size_change(
    dst_kw: dict[str, int],
) -> None:
    p = pair(geo(), geo(**dst_kw))
    kv = prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)), layers=2)
    p.tx.send_layer("r", 0)  # layer 1 not computed yet
    _drive(p, rounds=3)
    assert p.rx.layer_ready("r", 0) and not p.rx.layer_ready("r", 1)
    blocks = p.rx.held()["r"]
    assert torch.equal(read_kv(p.dst, blocks, 10, layer=0), kv[0])  # main: zeros
    p.tx.send_layer("r", 1)
    _drive(p)
    assert p.rx.state("r") is State.DONE
    assert torch.equal(read_kv(p.dst, p.rx.result("r").blocks, 10), kv)


def test_with_stage_true_a_layer_is_ready_only_once_in_the_target_blocks() -> None:
    """``stage=True`` writes the targets only after every block verified, so no layer is
    ready before the commit (main said ready while the targets held zeros)."""
    p = pair(geo(), geo())
    p.rx = Receiver(p.dst, p.rx.geometry, p.t, MODEL, stage=True)
    kv = prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)), layers=2)
    p.tx.send_layer("r", 0)
    _drive(p, rounds=3)
    for layer in range(2):
        if p.rx.layer_ready("r", layer):
            got = read_kv(p.dst, p.rx.held()["r"], 10, layer=layer)
            assert torch.equal(got, kv[layer])
    assert not p.rx.layer_ready("r", 0)
    p.tx.send_layer("r", 1)
    _drive(p)
    assert p.rx.layer_ready("r", 0) and p.rx.layer_ready("r", 1)
    assert torch.equal(read_kv(p.dst, p.rx.result("r").blocks, 10), kv)


# ---------------------------------------------------------------- 2: a layer leaves as sent
def test_a_streamed_layer_is_the_bytes_at_send_layer_not_at_the_receivers_ready() -> None:
    p = pair(geo(), geo(), src_cap=3)  # exactly the request's 3 blocks
    kv = prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)), layers=2, free_source=True)
    for layer in range(2):
        p.tx.send_layer("r", layer)  # computed before the receiver's ready
    freed = p.src.alloc.free("r")  # "each layer leaves as a copy": the request may free
    other = p.src.alloc.allocate("x", 3)
    assert sorted(other) == sorted(freed)  # reused by another request
    x = torch.randn(2, 2, 4, 12, 8, generator=torch.Generator().manual_seed(9))
    write_kv(p.src, "x", other, [list(layer) for layer in x])
    _drive(p)
    assert p.rx.state("r") is State.DONE
    got = read_kv(p.dst, p.rx.result("r").blocks, 10)
    assert torch.equal(got, kv)  # main: request x's bytes, sealed as r's and committed


# ---------------------------------------------------------------- 3, 4: TP ranks
def _ranked(tp: int = 2, cap: int = 8) -> tuple[InProcessTransport, list[Sender], Receiver]:
    t, g = InProcessTransport(), geo(tp=tp)
    txs = [Sender(g.make_rank_pools(r, cap), g, t, MODEL, rank=r) for r in range(tp)]
    dst = geo()
    return t, txs, Receiver(dst.make_pools(16), dst, t, MODEL)


def _rank_prefill(tx: Sender, rid: str, n: int = 10, seed: int = 0) -> list[int]:
    g = tx.geometry
    blocks = tx.pools.alloc.allocate(rid, g.blocks_for(n))
    kv = torch.randn(2, 2, g.kv_heads, n, 8, generator=torch.Generator().manual_seed(seed))
    h = g.kv_heads_per_rank
    r = tx.rank or 0
    for layer in range(2):
        write_kv_layer(tx.pools, rid, blocks, layer, [f[r * h : (r + 1) * h] for f in kv[layer]])
    return blocks


def _poll_all(txs: list[Sender], rx: Receiver, rid: str = "r", rounds: int = 6) -> None:
    for _ in range(rounds):
        rx.poll(rid)
        for tx in txs:
            tx.poll(rid)


@pytest.mark.parametrize("when", ["before_the_manifest_is_read", "while_sending"])
def test_one_ranks_abort_reaches_its_siblings_and_the_receiver_with_its_reason(
    when: str,
) -> None:
    t, txs, rx = _ranked()
    for tx in txs:
        tx.offer("r", list(range(10)), blocks=_rank_prefill(tx, "r"), layers=2, epoch=1)
    if when == "while_sending":
        _poll_all(txs, rx, rounds=2)
        txs[0].send_layer("r", 0)
        assert rx.state("r") is State.RECEIVING and txs[0].state("r") is State.SENDING
    txs[1].abort("r", "the router cancelled r")
    _poll_all(txs, rx)  # no timer fires: each side must hear it
    assert txs[0].state("r").final and txs[0].state("r") is not State.DONE
    assert any("the router cancelled r" in x for x in txs[0].reasons("r"))
    assert "rank 1" in " ".join(txs[0].reasons("r"))
    if rx.state("r") is not State.WAITING:  # the receiver saw the attempt: it ended too
        assert rx.state("r").final and "the router cancelled r" in str(rx.error("r"))
    assert rx.held() == {} and all(tx.held() == {} for tx in txs)
    assert held(rx.pools) == {}


def test_a_rank_sender_needs_the_attempts_epoch() -> None:
    _, txs, _ = _ranked()
    with pytest.raises(ValueError, match="epoch="):
        txs[0].offer("r", list(range(10)), blocks=_rank_prefill(txs[0], "r"), layers=2)
    assert txs[0].held() == {}


def test_after_a_rank_restarts_every_rank_offers_the_routers_epoch_and_it_lands() -> None:
    t, txs, rx = _ranked()
    blocks = [_rank_prefill(tx, "r") for tx in txs]
    for tx, b in zip(txs, blocks, strict=True):
        tx.offer("r", list(range(10)), blocks=b, layers=2, epoch=1)
    txs[0].abort("r", "first attempt cancelled")
    _poll_all(txs, rx)
    assert all(tx.state("r") in (State.ABORTED, State.REFUSED) for tx in txs)
    txs[1].crash()  # rank 1 restarts: it knows nothing of attempt 1
    blocks[1] = _rank_prefill(txs[1], "r")
    rx.forget("r")
    for tx, b in zip(txs, blocks, strict=True):
        tx.offer("r", list(range(10)), blocks=b, layers=2, epoch=2)  # the router's attempt 2
        for layer in range(2):
            tx.send_layer("r", layer)
    _poll_all(txs, rx)
    assert rx.state("r") is State.DONE and all(tx.state("r") is State.DONE for tx in txs)


def test_ranks_offering_different_epochs_are_refused_naming_rank_and_epochs() -> None:
    t, txs, rx = _ranked()
    txs[0].offer("r", list(range(10)), blocks=_rank_prefill(txs[0], "r"), layers=2, epoch=2)
    txs[1].offer("r", list(range(10)), blocks=_rank_prefill(txs[1], "r"), layers=2, epoch=1)
    for tx in txs:
        for layer in range(2):
            tx.send_layer("r", layer)
    _poll_all(txs, rx)  # no timer: main stalled here until each side's own timeout
    for side in (*txs, rx):
        assert side.state("r").final and side.state("r") is not State.DONE
    why = str(rx.error("r"))
    assert "RankAgreement" in why and "rank 1" in why and "epoch 1" in why and "2" in why
    assert any("rank 1" in x and "epoch 1" in x for x in txs[0].reasons("r"))
    assert rx.held() == {} and held(rx.pools) == {}


# ---------------------------------------------------------------- 6: forget
def test_sender_forget_drops_an_ended_offer_and_refuses_a_live_one() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    with pytest.raises(InUseError, match="abort it first"):
        p.tx.forget("r")
    _drive(p)
    assert p.tx.state("r") is State.DONE
    p.tx.forget("r")
    p.rx.forget("r")
    with pytest.raises(KeyError):
        p.tx.state("r")
    p.tx.forget("never-offered")  # nothing to drop: a no-op


# ---------------------------------------------------------------- 7: no freed block ids
def test_result_after_the_engine_freed_the_blocks_answers_no_ids() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    _drive(p)
    got = p.rx.result("r")
    assert p.rx.pools.alloc.blocks_of("r") == got.blocks
    p.rx.pools.alloc.free("r")  # the engine finished with the request
    p.rx.pools.alloc.allocate("someone-else", 3)  # and reused its blocks
    with pytest.raises(StaleError, match="freed"):
        p.rx.result("r")  # main: the old ids, now someone else's
    assert p.rx.state("r") is State.DONE  # it did commit; there is nothing left to use


def test_after_the_engine_freed_a_committed_request_a_new_attempt_is_answered() -> None:
    p = pair(geo(), geo())
    kv = prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    _drive(p)
    p.rx.pools.alloc.free("r")
    p.tx.forget("r")
    p.tx.offer("r", list(range(10)), epoch=2)  # the request again (a re-prefill)
    p.rx.poll("r")
    assert p.rx.state("r") is State.RECEIVING and p.rx.held()["r"]
    _drive(p)
    got = p.rx.result("r")
    assert got.manifest.epoch == 2 and torch.equal(read_kv(p.dst, got.blocks, 10), kv)


def test_a_refused_second_manifest_leaves_the_committed_attempt_answered() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    _drive(p)
    first = p.rx.result("r")  # the engine decodes with these blocks
    p.tx.forget("r")
    p.tx.offer("r", list(range(10)), epoch=2)
    _drive(p)
    assert p.tx.state("r") is State.REFUSED
    assert any("already holds blocks" in x for x in p.tx.reasons("r"))
    assert p.rx.state("r") is State.DONE and p.rx.result("r") == first
    assert held(p.dst) == {"owned": 3}
