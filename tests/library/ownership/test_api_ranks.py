"""Ranks agree (issue #30, "What to build" 4), in one process: one ``RankSender`` per
prefill rank, one ``RankReceiver`` per decode rank, each with its own rank's pools, over
one transport. Layer by layer, bit-exact per decode rank (its own heads only), with a
decode-side prefix at decode TP 2; each decode rank receives only its heads' bytes; one
rank's abort ends every rank of both sides with its reason; a rank at another epoch
is refused by name; the request is ready only once every decode rank installed."""

from __future__ import annotations

import pytest
import torch

from refimpl import KVGeometry, State, read_kv, write_kv_layer
from refimpl.api.ranks import Epochs, RankReceiver, RankSender
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import MODEL

N, RID = 11, "r"


def _kv(heads: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 2, heads, N, 8, generator=torch.Generator().manual_seed(seed))


class Group:
    def __init__(self, src_tp: int, dst_tp: int, *, heads: int = 4, dst_bs: int = 4) -> None:
        self.src = KVGeometry(3, heads, 8, 4, "float32", tp=src_tp)
        self.dst = KVGeometry(3, heads, 8, dst_bs, "float32", tp=dst_tp)
        self.t, self.epochs = InProcessTransport(), Epochs()
        self.sp = [self.src.make_rank_pools(r, 16) for r in range(src_tp)]
        self.dp = [self.dst.make_rank_pools(d, 16) for d in range(dst_tp)]
        self.tx = [RankSender(p, self.src, self.t, MODEL, rank=r, dst_tp=dst_tp,
                              epochs=self.epochs) for r, p in enumerate(self.sp)]  # fmt: skip
        self.rx = [RankReceiver(p, self.dst, self.t, MODEL, rank=d, src_tp=src_tp)
                   for d, p in enumerate(self.dp)]  # fmt: skip
        self.kv = _kv(heads)
        self.blocks = [p.alloc.allocate(RID, self.src.blocks_for(N)) for p in self.sp]

    def write(self, layer: int) -> None:
        h = self.src.kv_heads_per_rank
        for r, (p, b) in enumerate(zip(self.sp, self.blocks, strict=True)):
            kv = self.kv[layer, :, r * h : (r + 1) * h]
            write_kv_layer(p, RID, b, layer, [kv[0], kv[1]])

    def poll(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            for x in [*self.rx, *self.tx]:
                x.poll(RID)

    def run(self, *, prefix_blocks: int = 0, upto: int = 3) -> None:
        self.epochs.open(RID)  # the router opens the attempt: every rank offers its epoch
        for d, rx in enumerate(self.rx):
            rx.expect(RID, decode_room=2, **self.prefix(d, prefix_blocks))
        for r, tx in enumerate(self.tx):
            tx.offer(RID, list(range(N)), blocks=self.blocks[r], prefix_blocks=prefix_blocks)
        for layer in range(upto):
            self.write(layer)
            for tx in self.tx:
                tx.send_layer(RID, layer)
            self.poll(2)
        self.poll()

    def prefix(self, d: int, n: int) -> dict[str, object]:
        """``n`` prefix blocks already held by decode rank d (its heads of them)."""
        if not n:
            return {}
        p, h, bs = self.dp[d], self.dst.kv_heads_per_rank, self.dst.block_size
        held = p.alloc.allocate("cached", n)
        kv = self.kv[:, :, d * h : (d + 1) * h, : n * bs]
        for layer in range(3):
            write_kv_layer(p, "cached", held, layer, [kv[layer, 0], kv[layer, 1]])
        return {"prefix": held, "prefix_tokens": list(range(n * bs))}

    def leftover(self) -> list[object]:
        """Blocks held by anything but the request's own prefill blocks and the prefix."""
        left = [p.alloc.holders() for p in self.sp]
        return [h for hs in left for h in hs if h != RID] + [
            h for p in self.dp for h in p.alloc.holders() if h != "cached"
        ]


@pytest.mark.parametrize(("src_tp", "dst_tp"), [(2, 2), (1, 2), (2, 1), (4, 2), (2, 4)])
def test_every_decode_rank_gets_its_own_heads_bit_exact(src_tp: int, dst_tp: int) -> None:
    g = Group(src_tp, dst_tp, dst_bs=8 if src_tp == 2 else 4)
    g.run()
    h = g.dst.kv_heads_per_rank
    for d, (rx, p) in enumerate(zip(g.rx, g.dp, strict=True)):
        assert rx.ready(RID) and rx.state(RID) is State.DONE, (d, rx.state(RID), rx.reasons(RID))
        got = read_kv(p, rx.blocks(RID), N)
        assert torch.equal(got, g.kv[:, :, d * h : (d + 1) * h]), d
    assert all(tx.state(RID) is State.DONE for tx in g.tx)
    per_rank = 3 * 2 * h * 4 * 8 * 4 * g.src.blocks_for(N)  # layers, k/v, heads, slots, dim, f32
    to = [sum(tx.stats(RID).get(d, (0, 0))[1] for tx in g.tx) for d in range(dst_tp)]
    assert to == [per_rank] * dst_tp  # every byte sent once, to the rank that holds it
    assert all(not tx.held() for tx in g.tx)


def test_a_decode_side_prefix_is_skipped_at_decode_tp_2() -> None:
    g = Group(2, 2)
    g.run(prefix_blocks=1)
    h = g.dst.kv_heads_per_rank
    for d, (rx, p) in enumerate(zip(g.rx, g.dp, strict=True)):
        assert rx.ready(RID), rx.reasons(RID)
        assert torch.equal(read_kv(p, rx.blocks(RID), N), g.kv[:, :, d * h : (d + 1) * h])
    sent = [x for tx in g.tx for x in tx.stats(RID).values()]
    assert sum(n for n, _ in sent) == 2 * 3  # a chunk per (rank, layer), not per block
    per_block = 3 * 2 * h * 4 * 8 * 4  # layers, k/v, heads, slots, dim, f32
    assert sum(b for _, b in sent) == 2 * per_block * (g.src.blocks_for(N) - 1)  # not the prefix


@pytest.mark.parametrize("who", ["prefill 1", "decode 0"])
def test_one_ranks_abort_ends_every_rank_of_both_sides_with_its_reason(who: str) -> None:
    g = Group(2, 2)
    g.run(upto=1)  # layer 0 out, then one rank is cancelled
    side, rank = who.split()
    (g.tx if side == "prefill" else g.rx)[int(rank)].abort(RID, "the router cancelled")
    g.poll()
    for x in [*g.tx, *g.rx]:
        assert x.state(RID) is State.ABORTED, x.state(RID)
        want = f"{side} rank {rank} aborted: the router cancelled"
        assert any(want in r for r in x.reasons(RID)), (x, x.reasons(RID))
    assert g.leftover() == [] and all(not rx.held() for rx in g.rx)


def test_a_failed_decode_rank_after_a_sibling_committed_gives_back_every_block() -> None:
    g = Group(2, 2)
    g.t.inject("kv:r@1>rx", "corrupt", skip=2)  # decode rank 1's second chunk
    g.run()
    assert g.rx[1].state(RID) is State.ABORTED and "checksum" in g.rx[1].reasons(RID)[0]
    for x in [*g.tx, g.rx[0]]:
        assert x.state(RID) is State.ABORTED and "decode rank 1" in x.reasons(RID)[0], x
    assert not g.rx[0].ready(RID) and g.leftover() == []


def test_ranks_at_different_epochs_are_refused_by_name() -> None:
    g = Group(2, 2)
    g.epochs.open(RID)
    for rx in g.rx:
        rx.expect(RID)
    g.tx[0].offer(RID, list(range(N)), blocks=g.blocks[0])
    g.epochs.open(RID)  # a retry opened between the ranks' offers: rank 1 reads epoch 2
    g.tx[1].offer(RID, list(range(N)), blocks=g.blocks[1])
    for layer in range(3):
        g.write(layer)
        for tx in g.tx:
            tx.send_layer(RID, layer)
    g.poll()
    for x in [*g.tx, *g.rx]:
        assert x.state(RID) is State.ABORTED, x
        assert any("[RankAgreement]" in r and "epoch" in r for r in x.reasons(RID)), x.reasons(RID)
    assert g.leftover() == []


def test_epochs_choose_one_epoch_for_every_rank_restart_included() -> None:
    e = Epochs()
    with pytest.raises(ValueError, match="no attempt opened"):
        e.current("q")
    assert e.open("q") == 1 and e.current("q") == 1
    again = Epochs(e.store)  # a restarted rank, the same store
    assert again.current("q") == 1 and again.open("q") == 2 and e.current("q") == 2


def test_a_restarted_rank_offers_the_retry_its_siblings_offer() -> None:
    g = Group(2, 2)
    g.run(upto=1)
    g.tx[1].abort(RID, "process restarting")  # rank 1 goes down; every rank hears it
    g.poll()
    assert all(x.state(RID) is State.ABORTED for x in [*g.tx, *g.rx])
    g.sp[1] = g.src.make_rank_pools(1, 16)  # its new incarnation: empty pools, no records
    g.tx[1] = RankSender(
        g.sp[1], g.src, g.t, MODEL, rank=1, dst_tp=2, epochs=Epochs(g.epochs.store)
    )
    g.blocks[1] = g.sp[1].alloc.allocate(RID, g.src.blocks_for(N))
    for x in [g.tx[0], *g.rx]:
        x.forget(RID)
    g.run()  # the router opens the retry (epoch 2): both ranks offer it
    assert [tx.state(RID) for tx in g.tx] == [State.DONE] * 2
    h = g.dst.kv_heads_per_rank
    for d, (rx, p) in enumerate(zip(g.rx, g.dp, strict=True)):
        assert rx.ready(RID), rx.reasons(RID)
        assert torch.equal(read_kv(p, rx.blocks(RID), N), g.kv[:, :, d * h : (d + 1) * h])


def test_a_crashed_rank_loses_everything_and_its_siblings_end_on_its_failure() -> None:
    """``RankSender.crash`` / ``RankReceiver.crash`` (a rank's process died, as
    ``Sender.crash`` / ``Receiver.crash``): the rank forgets its attempts and its pools
    are empty (its sub-handoffs' copies too); the engine then ends the request on the
    ranks left (``abort`` with the reason), which end every live rank, 0 blocks held."""
    g = Group(2, 2)
    g.run(upto=1)  # layer 0 of 3 sent: every decode rank is receiving
    g.tx[1].crash()
    g.rx[1].crash()
    assert not g.sp[1].alloc.holders() and not g.dp[1].alloc.holders()
    assert g.rx[1].state(RID) is State.WAITING and RID not in g.tx[1]._g  # noqa: SLF001
    g.tx[0].abort(RID, "prefill rank 1 died")
    g.poll()
    for x in (g.tx[0], g.rx[0]):
        assert x.state(RID) is State.ABORTED
        assert any("prefill rank 1 died" in r for r in x.reasons(RID)), x.reasons(RID)
    assert not g.dp[0].alloc.holders() and not g.rx[0].held()


def _offer_and_send(g: Group, ranks: range) -> None:
    for r in ranks:
        g.tx[r].offer(RID, list(range(N)), blocks=g.blocks[r])
    for layer in range(3):
        g.write(layer)
        for r in ranks:
            g.tx[r].send_layer(RID, layer)


def _poll(xs: list[RankSender | RankReceiver], rounds: int = 20) -> None:
    for _ in range(rounds):
        for x in xs:
            x.poll(RID)


def test_forget_before_the_attempt_keeps_a_faster_ranks_installed() -> None:
    """The cluster's decode rank 1 forgets what it may hold of the request when its
    leader's word of the attempt comes (``refimpl.cluster.decode``: ``on_handoff``). If
    decode rank 0 installed first, its "installed" is already on rank 1's group channel:
    forget dropped it, rank 1 never became ready, and the attempt died by its timer
    (``kvown cluster --decode-tp 2``: 164 requests failed). A forget drops only what is
    of the attempts it ends, never a newer attempt's messages."""
    g = Group(2, 2)
    g.epochs.open(RID)
    g.rx[0].expect(RID, decode_room=2)
    _offer_and_send(g, range(2))
    _poll([g.rx[0], *g.tx])  # decode rank 0 installs and tells everyone, rank 1 idle
    assert "decode rank 1" in " ".join(g.rx[0].waiting(RID))
    g.rx[1].forget(RID)  # nothing of the request here yet: nothing to drop
    g.rx[1].expect(RID, decode_room=2)
    g.poll()
    assert [rx.state(RID) for rx in g.rx] == [State.DONE] * 2, [rx.reasons(RID) for rx in g.rx]
    assert [tx.state(RID) for tx in g.tx] == [State.DONE] * 2


def test_forget_of_an_ended_attempt_keeps_the_retrys_installed() -> None:
    """The same on a retry, on both sides: attempt 1 ended on every rank; decode rank 0
    and prefill rank 0 run attempt 2 to decode rank 0's install before decode rank 1 and
    prefill rank 1 forget attempt 1: their forget keeps attempt 2's "installed"."""
    g = Group(2, 2)
    g.run(upto=1)
    g.tx[0].abort(RID, "a Ready was lost")
    g.poll()
    assert all(x.state(RID) is State.ABORTED for x in [*g.tx, *g.rx])
    g.tx[0].forget(RID)
    g.rx[0].forget(RID)
    assert g.epochs.open(RID) == 2
    g.rx[0].expect(RID, decode_room=2)
    _offer_and_send(g, range(1))
    _poll([g.rx[0], g.tx[0]])  # decode rank 0 installed attempt 2
    assert "decode rank 1's install at epoch 2" in g.rx[0].waiting(RID)
    assert g.rx[0].rx.state(f"{RID}@0") is State.DONE  # its own part committed
    g.tx[1].forget(RID)
    g.rx[1].forget(RID)
    g.rx[1].expect(RID, decode_room=2)
    g.tx[1].offer(RID, list(range(N)), blocks=g.blocks[1])
    for layer in range(3):
        g.tx[1].send_layer(RID, layer)
    g.poll()
    assert [rx.state(RID) for rx in g.rx] == [State.DONE] * 2, [rx.reasons(RID) for rx in g.rx]
    assert [tx.state(RID) for tx in g.tx] == [State.DONE] * 2, [tx.reasons(RID) for tx in g.tx]


def test_an_older_attempts_abort_heard_before_the_retry_arrives_does_not_end_it() -> None:
    """``kvown cluster --decode-tp 2`` (5 of 300 requests failed "waiting on decode rank
    1's install at epoch 2"): attempt 1's Ready was dropped, decode rank 0 timed out and
    told every rank (its abort rides the router's store to decode rank 1), while the
    retry's word reached decode rank 1 first over its pair group. Decode rank 1 took
    attempt 2 (``expect(epoch=2)``); attempt 1's abort, heard before attempt 2's manifest
    came, ended attempt 2 there, and it was never installed. An abort of an older
    attempt than the one expected is void."""
    g = Group(2, 2)
    g.epochs.open(RID)
    for rx in g.rx:
        rx.expect(RID, decode_room=2, epoch=1)
    _offer_and_send(g, range(1))  # prefill rank 1 never offers attempt 1 (no "go")
    _poll([g.rx[0], g.tx[0]])
    g.rx[0].abort(RID, "not committed within 6s of its ready")
    g.rx[1].abort(RID, "superseded by a newer attempt")  # its part never came
    for x in [g.tx[0], *g.rx]:
        x.poll(RID)
        x.forget(RID)
    assert g.epochs.open(RID) == 2
    g.rx[1].expect(RID, decode_room=2, epoch=2)
    g.rx[1].poll(RID)  # attempt 1's abort arrives now, before attempt 2's manifest
    assert g.rx[1].state(RID) is State.WAITING, g.rx[1].reasons(RID)
    g.rx[0].expect(RID, decode_room=2, epoch=2)
    g.tx[1].forget(RID)
    _offer_and_send(g, range(2))
    g.poll()
    assert [rx.state(RID) for rx in g.rx] == [State.DONE] * 2, [rx.reasons(RID) for rx in g.rx]
    assert [tx.state(RID) for tx in g.tx] == [State.DONE] * 2, [tx.reasons(RID) for tx in g.tx]


@pytest.mark.parametrize("named", [True, False])
def test_forget_keeps_nothing_of_the_attempt_it_ends(named: bool) -> None:
    """What forget keeps is a newer attempt's alone: a rank that heard attempt 1's offer
    before its part came, then ended it, keeps none of it when ``expect`` named epoch 1
    (without the epoch the rank cannot tell attempt 1's messages from a retry's: they
    wait for the next attempt, which reads them as older and void)."""
    g = Group(2, 2)
    g.epochs.open(RID)
    g.rx[1].expect(RID, decode_room=2, **({"epoch": 1} if named else {}))
    _offer_and_send(g, range(1))
    g.rx[1].poll(RID)  # prefill rank 0's offer at epoch 1, heard before its own part
    assert len(g.rx[1]._early[RID]) == 1  # noqa: SLF001
    g.rx[1].abort(RID, "the request failed")
    g.rx[1].forget(RID)
    assert (RID in g.rx[1]._early) is not named  # noqa: SLF001
