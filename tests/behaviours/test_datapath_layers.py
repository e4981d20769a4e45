"""Layer by layer through the public API: a sender offers a request before its KV exists
and ships each layer as prefill computes it (``send_layer``, vLLM's ``save_kv_layer``); the
receiver reports each layer landed (``layer_ready``, ``wait_for_layer_load``) while the
blocks stay RESERVED, and the request owns them only at commit. A failure after some
layers landed gives back every block on both sides."""

from __future__ import annotations

import pytest
import torch

from refimpl import KVGeometry, ModelIdentity, Receiver, Sender, State, channels, read_kv
from refimpl.api import write_kv_layer
from refimpl.checksum import bytes_checksum
from refimpl.errors import CancelledError, ChecksumError, ChunkError, InUseError
from refimpl.transport import Fault, InProcessTransport
from tests.library.lib_helpers import MODEL, Pair, geo, held, pair

TOKENS = list(range(100, 110))  # 10 tokens


def _kv(g: KVGeometry, n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (g.num_layers, 2, g.kv_heads, n, g.head_dim)
    return torch.randn(shape, generator=gen).to(g.torch_dtype)


def _rounds(p: Pair, rid: str = "r") -> None:
    for _ in range(3):
        p.rx.poll(rid)
        p.tx.poll(rid)


def _stream(p: Pair, rid: str = "r", *, stop_after: int | None = None) -> torch.Tensor:
    """Prefill layer by layer, each layer sent once written; returns the KV written."""
    g = p.tx.geometry
    blocks = p.src.alloc.allocate(rid, g.blocks_for(len(TOKENS)))
    kv = _kv(g, len(TOKENS))
    p.tx.offer(rid, TOKENS, blocks=blocks, layers=g.num_layers, dst_tp=p.rx.geometry.tp)
    for layer in range(g.num_layers):
        if layer == stop_after:
            break
        write_kv_layer(p.src, rid, blocks, layer, list(kv[layer]))
        p.tx.send_layer(rid, layer)
        _rounds(p, rid)
    return kv


STREAMS = {
    "same": ({}, {}),
    "tp2_to_1": ({"tp": 2}, {}),
    "tp1_to_2_tokens_major": ({}, {"tp": 2, "layout": "tokens_major"}),
    "tp2_block4_to_block8": ({"tp": 2}, {"block_size": 8}),  # staged, resharded at commit
    "gqa_replicated_kv2_tp4": ({"kv_heads": 2, "tp": 4}, {"kv_heads": 2}),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_streamed_offer_lands_the_same_tokens(name: str) -> None:
    src_kw, dst_kw = STREAMS[name]
    p = pair(geo(num_layers=3, **src_kw), geo(num_layers=3, **dst_kw))
    p.rx.expect("r", decode_room=2)
    kv = _stream(p)
    assert p.rx.state("r") is State.DONE and p.tx.state("r") is State.DONE
    got = p.rx.result("r")
    assert torch.equal(read_kv(p.dst, got.blocks, len(TOKENS)), kv)
    assert held(p.dst) == {"owned": len(got.blocks)}
    assert p.tx.held() == {} and held(p.src) == {"owned": p.tx.geometry.blocks_for(10)}


def test_a_landed_layer_is_ready_but_not_owned() -> None:
    p = pair(geo(num_layers=3), geo(num_layers=3))
    kv = _stream(p, stop_after=2)  # layers 0 and 1 computed and sent, layer 2 not yet
    assert [p.rx.layer_ready("r", i) for i in range(3)] == [True, True, False]
    assert p.rx.state("r") is State.RECEIVING
    assert held(p.dst) == {"reserved": 3}  # landed, not owned: nothing to decode from yet
    with pytest.raises(InUseError, match="not finished"):
        p.rx.result("r")
    write_kv_layer(p.src, "r", p.src.alloc.blocks_of("r"), 2, list(kv[2]))
    p.tx.send_layer("r", 2)
    _rounds(p)
    assert p.rx.layer_ready("r", 2) and held(p.dst) == {"owned": 3}
    assert torch.equal(read_kv(p.dst, p.rx.result("r").blocks, 10), kv)


def test_layers_computed_before_ready_go_out_on_ready() -> None:
    p = pair(geo(), geo())
    g = p.tx.geometry
    blocks = p.src.alloc.allocate("r", 3)
    kv = _kv(g, 10)
    p.tx.offer("r", TOKENS, blocks=blocks, layers=2)
    for layer in range(2):  # prefill is faster than the receiver's ready
        write_kv_layer(p.src, "r", blocks, layer, list(kv[layer]))
        assert p.tx.send_layer("r", layer) == 0  # queued, not sent
    _rounds(p)
    assert torch.equal(read_kv(p.dst, p.rx.result("r").blocks, 10), kv)


@pytest.mark.parametrize("fault", ["corrupt", "lose_seal", "forged_seal", "sender_abort"])
def test_a_failure_after_layers_landed_gives_back_every_block(fault: str) -> None:
    p = pair(geo(num_layers=3), geo(num_layers=3))
    to_rx = channels("r").to_receiver
    if fault == "corrupt":  # manifest, then layer 0 (one chunk of 3 blocks), then layer 1
        p.t.inject(to_rx, Fault.CORRUPT, skip=2)
    if fault in ("lose_seal", "forged_seal"):  # manifest, 3 layers (a chunk each), the seal
        p.t.inject(to_rx, Fault.LOSE, skip=4)
    _stream(p, stop_after=1 if fault in ("corrupt", "sender_abort") else None)
    if fault == "corrupt":
        kv = _kv(p.tx.geometry, 10)
        write_kv_layer(p.src, "r", p.src.alloc.blocks_of("r"), 1, list(kv[1]))
        p.tx.send_layer("r", 1)
        _rounds(p)
        assert isinstance(p.rx.error("r"), ChecksumError)
    elif fault == "sender_abort":
        assert p.rx.layer_ready("r", 0)
        p.tx.abort("r", "prefill failed")
        _rounds(p)
        assert isinstance(p.rx.error("r"), CancelledError)
    elif fault == "forged_seal":
        seal = {"type": "seal", "request_id": "r", "epoch": 1, "rank": 0}
        forged = [[layer, 0, 3, "0" * 16] for layer in range(3)]  # well formed, wrong sums
        p.t.send(to_rx, {**seal, "chunks": forged})
        _rounds(p)
        assert isinstance(p.rx.error("r"), ChecksumError)
    else:  # every layer landed, the seal never came: the receiver times out
        assert all(p.rx.layer_ready("r", i) for i in range(3))
        assert p.rx.state("r") is State.RECEIVING and held(p.dst) == {"reserved": 3}
        p.rx.abort("r", "timeout")
        _rounds(p)
    assert p.rx.state("r") is State.ABORTED and p.tx.state("r") is State.ABORTED
    assert not any(p.rx.layer_ready("r", i) for i in range(3))
    assert held(p.dst) == {}
    assert p.tx.held() == {}


def test_a_reordered_layer_still_hashes_in_layer_order() -> None:
    p = pair(geo(num_layers=3, block_size=16), geo(num_layers=3))  # one block sent
    p.t.inject(channels("r").to_receiver, Fault.REORDER, skip=1)  # layer 0 after layer 1
    blocks = p.src.alloc.allocate("r", 1)
    kv = _kv(p.tx.geometry, 10)
    p.tx.offer("r", TOKENS, blocks=blocks, layers=3)
    for layer in range(3):  # all computed before the ready: sent back to back
        write_kv_layer(p.src, "r", blocks, layer, list(kv[layer]))
        p.tx.send_layer("r", layer)
    _rounds(p)
    assert p.t.stats["reordered"] == 1
    assert torch.equal(read_kv(p.dst, p.rx.result("r").blocks, 10), kv)


def test_one_sender_per_rank_in_one_transport() -> None:
    """Two Senders, one per TP rank with only its own heads, and a TP 1 receiver."""
    src, dst = geo(tp=2, num_layers=2), geo(block_size=8, num_layers=2)
    t = InProcessTransport()
    pools = [src.make_rank_pools(r, 8) for r in range(2)]
    txs = [Sender(pools[r], src, t, MODEL, rank=r) for r in range(2)]
    pd = dst.make_pools(8)
    rx = Receiver(pd, dst, t, MODEL)
    kv, h = _kv(src, 10), src.kv_heads_per_rank
    blocks = [pl.alloc.allocate("r", 3) for pl in pools]
    for tx, b in zip(txs, blocks, strict=True):
        tx.offer("r", TOKENS, blocks=b, layers=2, epoch=1)
    for layer in range(2):
        for r, tx in enumerate(txs):
            write_kv_layer(pools[r], "r", blocks[r], layer, list(kv[layer, :, r * h : (r + 1) * h]))
            tx.send_layer("r", layer)
        for _ in range(2):
            rx.poll("r")
            for tx in txs:
                tx.poll("r")
    assert [tx.state("r") for tx in txs] == [State.DONE, State.DONE]
    assert torch.equal(read_kv(pd, rx.result("r").blocks, 10), kv)


def test_streamed_misuse_is_named() -> None:
    p = pair(geo(), geo())
    blocks = p.src.alloc.allocate("r", 3)
    with pytest.raises(ValueError, match="sends all 2 layers"):
        p.tx.offer("r", TOKENS, blocks=blocks, layers=1)
    p.tx.offer("r", TOKENS, blocks=blocks, layers=2)
    with pytest.raises(ValueError, match="out of order; the next is 0"):
        p.tx.send_layer("r", 1)
    with pytest.raises(ValueError, match="rank=2"):
        geo(tp=2).make_rank_pools(2, 4)
    with pytest.raises(ValueError, match="rank 1 pools"):
        Sender(geo(tp=2).make_pools(4), geo(tp=2), p.t, MODEL, rank=1)


def test_a_chunk_of_a_layer_that_does_not_exist_aborts() -> None:
    p = pair(geo(), geo())
    blocks = p.src.alloc.allocate("r", 3)
    p.tx.offer("r", TOKENS, blocks=blocks, layers=2)
    _rounds(p)
    bad = {"type": "chunk", "request_id": "r", "epoch": 1, "block_index": 0, "rank": 0}
    p.t.send(channels("r").to_receiver, {**bad, "layer": 2, "checksum": "0" * 16}, b"")
    p.rx.poll("r")
    assert isinstance(p.rx.error("r"), ChunkError) and held(p.dst) == {}


def test_a_refused_ranked_offer_ends_every_rank() -> None:
    """The nack of a manifest from rank 0 reaches every rank's Sender (each its own)."""
    src, dst = geo(tp=2), geo()
    t = InProcessTransport()
    pools = [src.make_rank_pools(r, 4) for r in range(2)]
    txs = [Sender(pools[r], src, t, MODEL, rank=r) for r in range(2)]
    other = ModelIdentity("another-model", MODEL.rope)
    rx = Receiver(dst.make_pools(4), dst, t, other)
    for tx, pl in zip(txs, pools, strict=True):
        tx.offer("r", TOKENS, blocks=pl.alloc.allocate("r", 3), layers=2, epoch=1)
    rx.poll("r")
    for tx in txs:
        tx.poll("r")
    assert rx.state("r") is State.REFUSED
    assert [tx.state("r") for tx in txs] == [State.REFUSED, State.REFUSED]
    assert all("model_id" in tx.reasons("r")[0] for tx in txs)
    assert [tx.send_layer("r", 0) for tx in txs] == [0, 0]  # nothing more goes out


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_handoff_layered_lands_the_same_tokens(name: str) -> None:
    from refimpl import handoff

    src_kw, dst_kw = STREAMS[name]
    p = pair(geo(num_layers=3, **src_kw), geo(num_layers=3, **dst_kw))
    g = p.tx.geometry
    blocks = p.src.alloc.allocate("r", g.blocks_for(10))
    kv = _kv(g, 10)
    for layer in range(3):
        write_kv_layer(p.src, "r", blocks, layer, list(kv[layer]))
    res = handoff(p.tx, p.rx, "r", TOKENS, blocks=blocks, decode_room=3, layered=True)
    assert torch.equal(read_kv(p.dst, res.received.blocks, 10), kv)
    assert res.chunks == 3 * len(p.tx.ranks)  # a chunk per (rank, layer), not per block
    assert held(p.src) == {} and held(p.dst) == {"owned": len(res.received.blocks)}


@pytest.mark.parametrize("run", [{"blocks": 4}, {"blocks": 0}, {"blocks": "3"}, {"block_index": 3}])
def test_a_layer_chunk_naming_other_blocks_than_sent_aborts(run: dict[str, object]) -> None:
    """A (rank, layer) chunk holds a run of the sent blocks: a run past them, empty, or
    not an int is refused by name before a byte is written, and nothing is kept."""
    p = pair(geo(), geo())
    blocks = p.src.alloc.allocate("r", 3)
    p.tx.offer("r", TOKENS, blocks=blocks, layers=2)
    _rounds(p)
    g = p.tx.geometry.rank_pool_geometry()
    head = {"type": "chunk", "request_id": "r", "epoch": 1, "rank": 0, "layer": 0}
    payload = bytes(3 * g.block_bytes // g.num_layers)
    header = {**head, "block_index": 0, "blocks": 3, **run, "checksum": bytes_checksum(payload)}
    p.t.send(channels("r").to_receiver, header, payload)
    p.rx.poll("r")
    assert isinstance(p.rx.error("r"), ChunkError) and held(p.dst) == {}


def test_a_split_layer_lands_the_same_and_a_duplicate_run_changes_nothing() -> None:
    """``blocks_per_chunk=2``: each layer goes as runs of 2 blocks (3 blocks: 2 + 1)."""
    p = pair(geo(), geo())
    tx = Sender(p.src, p.tx.geometry, p.t, MODEL, blocks_per_chunk=2)
    blocks = p.src.alloc.allocate("r", 3)
    kv = _kv(tx.geometry, 10)
    p.t.inject(channels("r").to_receiver, Fault.DUPLICATE, skip=1)  # layer 0's first run
    tx.offer("r", TOKENS, blocks=blocks, layers=2)
    for layer in range(2):
        write_kv_layer(p.src, "r", blocks, layer, list(kv[layer]))
        tx.send_layer("r", layer)
    for _ in range(3):
        p.rx.poll("r")
        tx.poll("r")
    assert tx.state("r") is State.DONE and tx.stats("r")[0] == 2 * 2
    assert torch.equal(read_kv(p.dst, p.rx.result("r").blocks, 10), kv)
