"""``Progress``: one call per step for every request of an end (issue #31, item 2), in one
process: requests finish together without the caller polling each one, deadlines are
kvown's (a fake clock here), each end is reported exactly once with its reasons and the
blocks it gave back, and the ends' records are forgotten once reported."""

from __future__ import annotations

import pytest
import torch

from refimpl import KVGeometry, read_kv, write_kv_layer
from refimpl.api import State
from refimpl.api.ranks import Epochs, RankReceiver, RankSender, sub_id
from refimpl.api.serve import Progress, Step
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import MODEL, geo, held, pair, prefill


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _steps(*ends: Progress, rounds: int = 50) -> list[Step]:
    out = []
    for _ in range(rounds):
        out += [e.progress() for e in ends]
        if not any(e.watched() for e in ends):
            break
    return out


def test_every_request_finishes_through_one_call_per_step_and_is_reported_once() -> None:
    g = geo()
    p = pair(g, g)
    tx, rx = Progress(p.tx, timeout_s=30.0), Progress(p.rx, timeout_s=30.0)
    kv = {rid: prefill(p, rid, 9, seed=i) for i, rid in enumerate(("a", "b", "c"))}
    for rid in ("c", "a", "b"):  # the receiver's order is not the sender's
        rx.expect(rid, decode_room=1)
    for rid in ("a", "b", "c"):
        tx.offer(rid, list(range(9)), blocks=p.src.alloc.blocks_of(rid))
    steps = _steps(tx, rx)
    sent = [r for s in steps for r in s.finished_sending]
    got = {r: b for s in steps for r, b in s.finished_receiving.items()}
    assert sorted(sent) == ["a", "b", "c"] and sorted(got) == ["a", "b", "c"]
    assert not [f for s in steps for f in s.failed]
    for rid, blocks in got.items():  # the committed blocks, as reported, hold the KV
        assert blocks == p.dst.alloc.blocks_of(rid)
        assert torch.equal(read_kv(p.dst, blocks, 9), kv[rid])
        p.dst.alloc.free(rid)
        p.src.alloc.free(rid)
    assert tx.progress() == Step() and rx.progress() == Step()  # nothing twice
    assert p.tx.records() == 0 and set(p.rx.records().values()) == {0}  # forgotten
    assert held(p.src) == {} and held(p.dst) == {}


def test_deadlines_are_kvowns_and_name_what_the_request_held() -> None:
    g, clock = geo(), Clock()
    p = pair(g, g)
    tx, rx = Progress(p.tx, timeout_s=5.0, clock=clock), Progress(p.rx, clock=clock)
    prefill(p, "unheard", 9)
    blocks = p.src.alloc.blocks_of("unheard")
    tx.offer("unheard", list(range(9)), blocks=blocks)  # nobody receives it
    rx.expect("never-offered", timeout_s=2.0)  # nobody sends it
    clock.now = 1.9
    assert tx.progress() == Step(live=1) and rx.progress() == Step(live=1)
    clock.now = 2.0
    (lost,) = rx.progress().failed
    assert lost.request_id == "never-offered" and lost.blocks == ()
    assert "timeout after 2 s" in lost.reasons[0] and "no manifest" in lost.reasons[0]
    assert p.tx.held() == {"unheard": blocks}  # its own deadline has not passed yet
    clock.now = 5.0
    step = tx.progress()
    (gone,) = step.failed
    assert gone.request_id == "unheard" and gone.state is State.ABORTED
    assert gone.blocks == blocks and "timeout" in gone.reasons[0] and step.live == 0
    assert p.tx.held() == {} and p.tx.records() == 0


def test_a_cancel_and_a_refusal_are_failures_with_their_reasons() -> None:
    p = pair(geo(), geo(head_dim=16))  # the receiver's geometry refuses the manifest
    tx, rx = Progress(p.tx), Progress(p.rx)
    for rid in ("cancelled", "refused"):
        prefill(p, rid, 5)
        rx.expect(rid)
        tx.offer(rid, list(range(5)), blocks=p.src.alloc.blocks_of(rid))
    p.tx.abort("cancelled", "the user left")  # the engine's cancel: the end's own call
    steps = _steps(tx, rx)
    failed = {(f.request_id, f.state) for s in steps for f in s.failed}
    assert ("cancelled", State.ABORTED) in failed and ("refused", State.REFUSED) in failed
    why = {f.request_id: " ".join(f.reasons) for s in steps for f in s.failed}
    assert "the user left" in why["cancelled"]
    assert "head_dim" in why["refused"]
    assert not any(s.finished_sending or s.finished_receiving for s in steps)
    assert p.tx.held() == {} and held(p.dst) == {}


def test_rank_ends_report_their_own_blocks_and_only_once_every_rank_installed() -> None:
    src = KVGeometry(2, 4, 8, 4, "float32", tp=2)
    dst = KVGeometry(2, 4, 8, 4, "float32", tp=2)
    t, epochs = InProcessTransport(), Epochs()
    sp = [src.make_rank_pools(r, 8) for r in range(2)]
    dp = [dst.make_rank_pools(d, 8) for d in range(2)]
    tx = [Progress(RankSender(p, src, t, MODEL, rank=r, dst_tp=2, epochs=epochs))
          for r, p in enumerate(sp)]  # fmt: skip
    rx = [Progress(RankReceiver(p, dst, t, MODEL, rank=d, src_tp=2)) for d, p in enumerate(dp)]
    kv = torch.randn(2, 2, 4, 7, 8, generator=torch.Generator().manual_seed(3))
    epochs.open("r")
    for x in rx:
        x.expect("r", decode_room=1)
    blocks = [p.alloc.allocate("r", 2) for p in sp]
    for r, x in enumerate(tx):
        x.offer("r", list(range(7)), blocks=blocks[r])
    for layer in range(2):
        for r, (p, b, x) in enumerate(zip(sp, blocks, tx, strict=True)):
            part = kv[layer, :, 2 * r : 2 * r + 2]
            write_kv_layer(p, "r", b, layer, [part[0], part[1]])
            x.end.send_layer("r", layer)
    steps = _steps(*rx, *tx)  # in this order, per round: rank 0's, rank 1's, then senders'
    got = [[s.finished_receiving for s in steps[d::4] if s.finished_receiving] for d in (0, 1)]
    assert [r for s in steps for r in s.finished_sending] == ["r", "r"]
    for d, p in enumerate(dp):
        assert len(got[d]) == 1, got  # reported once, by this rank
        mine = got[d][0]["r"]
        assert mine == p.alloc.blocks_of(sub_id("r", d))
        assert torch.equal(read_kv(p, mine, 7), kv[:, :, 2 * d : 2 * d + 2])


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_deadline_that_is_not_positive_is_refused(bad: float) -> None:
    p = pair(geo(), geo())
    with pytest.raises(ValueError, match="timeout_s"):
        Progress(p.tx, timeout_s=bad)
    with pytest.raises(ValueError, match="timeout_s"):
        Progress(p.tx).watch("x", timeout_s=bad)
