"""The library fuzz machine: ``Sender``/``Receiver``/``handoff`` under faults (Hypothesis).

Each example draws two geometries (layers, KV heads, head dim, block size, layout, dtype,
TP on each side) and a receiver capacity (sometimes too small: a full receiver), then
interleaves requests: prefill (the harness writes KV it keeps as the ground truth), offer,
message faults on either channel (loss, duplication, reordering, corruption), polls,
cancels and aborts on either end, crashes of either end, and one-call ``handoff``s.

Checked after every step: both allocators' conservation law; no block of the receiver is
OWNED by a request whose attempt did not commit, none RESERVED outside a live attempt; a
sender pins only for live attempts. Checked at every commit: the receiver's blocks hold
exactly the truth. At the end of every example (``teardown``): drain to quiescence (polls
until no message moves, then both ends time out what is left), free every request, and
assert that no block is held on either side.

    from refimpl.testing.library import LibraryMachine
    TestLibrary = LibraryMachine.TestCase
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from refimpl.api import KVGeometry, ModelIdentity, Receiver, Sender, State, channels, handoff
from refimpl.api.tokens import read_kv, write_kv
from refimpl.blocks import BlockStatus
from refimpl.errors import OwnershipError
from refimpl.transport import Fault, InProcessTransport
from spec import shardmap as sm
from spec.manifest import RopeConfig

MODEL = ModelIdentity("fuzz-model", RopeConfig(10000.0, 2))
FAULTS = [f.value for f in Fault]


@st.composite
def geometries(draw: Any) -> tuple[KVGeometry, KVGeometry]:
    """A sender and a receiver geometry of one model (each side its own mesh and paging)."""
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    common = dict(
        num_layers=draw(st.integers(1, 2)),
        kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([2, 4])),
        dtype=draw(st.sampled_from(["float32", "float16", "bfloat16"])),
    )
    tps = [t for t in (1, 2, 4) if kv_heads % t == 0 or t % kv_heads == 0]

    def side() -> KVGeometry:
        return KVGeometry(
            **common,
            block_size=draw(st.integers(1, 4)),
            layout=draw(st.sampled_from(sm.LAYOUTS)),
            tp=draw(st.sampled_from(tps)),
        )

    return side(), side()


class LibraryMachine(RuleBasedStateMachine):
    """One sender, one receiver, one transport; requests named r0, r1, ..."""

    def __init__(self) -> None:
        super().__init__()
        self.truth: dict[str, torch.Tensor] = {}  # rid -> [L, F, H, T, D] as prefilled
        self.checked: set[tuple[str, int]] = set()  # (rid, epoch) commits whose bytes matched
        self.committed: set[str] = set()  # checked and not yet freed by the receiver
        self.epochs: dict[str, int] = {}
        self.next_id = 0

    @initialize(pair=geometries(), dst_capacity=st.integers(1, 24))
    def setup(self, pair: tuple[KVGeometry, KVGeometry], dst_capacity: int) -> None:
        self.g_src, self.g_dst = pair
        self.t = InProcessTransport()
        self.src, self.dst = self.g_src.make_pools(24), self.g_dst.make_pools(dst_capacity)
        self.tx = Sender(self.src, self.g_src, self.t, MODEL)
        self.rx = Receiver(self.dst, self.g_dst, self.t, MODEL)

    # ------------------------------------------------------------ helpers
    def _prefilled(self) -> list[str]:
        return [r for r in self.truth if self.src.alloc.blocks_of(r)]

    def _live(self) -> list[str]:
        return [r for r in self.epochs if not self.tx.state(r).final]

    def _offerable(self) -> list[str]:
        return [r for r in self._prefilled() if r not in self._live()]

    def _check_commit(self, rid: str) -> None:
        if self.rx.state(rid) is not State.DONE or not self.dst.alloc.blocks_of(rid):
            return  # not committed, or committed and freed since (result() names no ids)
        got = self.rx.result(rid)
        if (rid, got.manifest.epoch) not in self.checked:
            kv = self.truth[rid]
            assert torch.equal(read_kv(self.dst, got.blocks, kv.shape[3]), kv), rid
            self.checked.add((rid, got.manifest.epoch))
            self.committed.add(rid)

    # ------------------------------------------------------------ rules
    @rule(n=st.integers(1, 12), room=st.integers(0, 2), seed=st.integers(0, 3))
    def prefill(self, n: int, room: int, seed: int) -> None:
        self._prefill(n, room, seed)

    def _prefill(self, n: int, room: int, seed: int) -> str | None:
        g, rid = self.g_src, f"r{self.next_id}"
        need = g.blocks_for(n) + room
        if not self.src.alloc.can_allocate(need):
            return None
        self.next_id += 1
        blocks = self.src.alloc.allocate(rid, need)
        gen = torch.Generator().manual_seed(seed * 1000 + n)
        kv = torch.randn((g.num_layers, 2, g.kv_heads, n, g.head_dim), generator=gen)
        kv = kv.to(g.torch_dtype)
        write_kv(self.src, rid, blocks, [list(layer) for layer in kv])
        self.truth[rid] = kv
        return rid

    @precondition(lambda self: bool(self._offerable()))
    @rule(data=st.data(), room=st.integers(0, 6), free_source=st.booleans())
    def offer(self, data: st.DataObject, room: int, free_source: bool) -> None:
        rid = data.draw(st.sampled_from(self._offerable()))
        self.epochs[rid] = self.epochs.get(rid, 0) + 1
        self.rx.expect(rid, decode_room=room)
        n = self.truth[rid].shape[3]
        blocks = self.src.alloc.blocks_of(rid)[: self.g_src.blocks_for(n)]
        tokens = list(range(n))
        self.tx.offer(
            rid,
            tokens,
            blocks=blocks,
            epoch=self.epochs[rid],
            dst_tp=self.g_dst.tp,
            free_source=free_source,
        )

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), fault=st.sampled_from(FAULTS), to_receiver=st.booleans())
    def inject(self, data: st.DataObject, fault: str, to_receiver: bool) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        ch = channels(rid)
        self.t.inject(ch.to_receiver if to_receiver else ch.to_sender, fault)

    @precondition(lambda self: bool(self.epochs))
    @rule(data=st.data())
    def poll(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.epochs)))
        self.rx.poll(rid)
        self._check_commit(rid)
        self.tx.poll(rid)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), sender=st.booleans())
    def cancel(self, data: st.DataObject, sender: bool) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        (self.tx if sender else self.rx).abort(rid, "cancelled")

    @rule(sender=st.booleans())
    def crash(self, sender: bool) -> None:
        """One end loses its process: attempts and pools gone; the peer must time out."""
        if sender:
            self.tx.crash()
            for rid in self.epochs:
                self.epochs[rid] += 1  # a restarted sender opens a new epoch
            self.epochs = {}
        else:
            self.rx.crash()
            self.committed.clear()

    @rule(n=st.integers(1, 12), room=st.integers(0, 4), fault=st.sampled_from([None, *FAULTS]))
    def one_call_handoff(self, n: int, room: int, fault: str | None) -> None:
        rid = self._prefill(n, 0, 0)
        if rid is None:
            return
        if fault is not None:
            self.t.inject(channels(rid).to_receiver, fault, skip=1)
        self.epochs[rid] = 1
        try:
            handoff(self.tx, self.rx, rid, list(range(n)), decode_room=room, free_source=False)
        except OwnershipError:
            assert rid not in self.rx.held() and rid not in self.tx.held()
            assert not self.dst.alloc.blocks_of(rid)
        self._check_commit(rid)

    @precondition(lambda self: bool(self.committed))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """Decode is done with a received request: free it on the receiver."""
        rid = data.draw(st.sampled_from(sorted(self.committed)))
        self.dst.alloc.free(rid)
        self.committed.discard(rid)

    # ------------------------------------------------------------ invariants
    @invariant()
    def conservation(self) -> None:
        if hasattr(self, "src"):
            self.src.alloc.check_integrity()
            self.dst.alloc.check_integrity()

    @invariant()
    def only_committed_requests_own_receiver_blocks(self) -> None:
        if not hasattr(self, "rx"):
            return
        live = self.rx.held()
        alloc = self.dst.alloc
        for holder in alloc.holders():
            statuses = {alloc.status(b) for b in alloc.blocks_of(holder)}
            if holder in live:
                continue  # a live attempt: reserved (and prefix references)
            assert self.rx.state(holder) is State.DONE, (holder, self.rx.state(holder))
            assert statuses == {BlockStatus.OWNED}, (holder, statuses)
        reserved = {b for b in range(alloc.capacity) if alloc.status(b) is BlockStatus.RESERVED}
        assert reserved <= {b for blocks in live.values() for b in blocks}

    @invariant()
    def sender_pins_only_for_live_attempts(self) -> None:
        if not hasattr(self, "tx"):
            return
        pinned = {h for h in self.src.alloc.holders() if "@pin" in h}
        assert pinned <= {f"{r}@pin{self.epochs[r]}" for r in self._live()}, pinned

    # ------------------------------------------------------------ the end of every example
    def teardown(self) -> None:
        if not hasattr(self, "tx"):
            return
        rids = sorted(set(self.epochs) | set(self.truth))
        for _ in range(8):  # quiescence: poll until no message moves
            moved = 0
            for rid in rids:
                moved += self.rx.poll(rid)
                self._check_commit(rid)
                moved += self.tx.poll(rid) if rid in self.epochs else 0
            if not moved:
                break
        for rid in rids:  # what is still open times out on both ends
            self.rx.abort(rid, "timeout")
            if rid in self.epochs:
                self.tx.abort(rid, "timeout")
            self.rx.poll(rid)
        assert self.rx.held() == {} and self.tx.held() == {}
        for rid in rids:
            self.dst.alloc.free(rid)
            self.src.alloc.free(rid)
        for side, pools in (("sender", self.src), ("receiver", self.dst)):
            pools.alloc.check_integrity()
            counts = pools.alloc.counts()
            assert counts["free"] == pools.alloc.capacity, (side, counts, pools.alloc.holders())
