"""Writers with every refcount, and the receiver aborted at every point (issue #27 item
3): the fuzz drove write paths only on blocks held once, and never called the receiver
after an abort, so a check that tested ``refcount == 2`` instead of ``> 1``, or a
receiver that installed after its attempt ended, survived it. The receiver is the public
API's ``Receiver`` (the one receive path), ended by its own ``abort`` or by the sender's.

Every pool write path (``write_block``, ``write_blocks``, ``write_block_bytes``, a
``copy_blocks`` destination) is driven on a block held by its owner alone (refcount 1: the
write lands), and shared by a prefix (the engine's ``#pfx`` reference), pinned by a
transfer (``freeze``'s pin) and held by a store (``@store``), in every combination
(refcount 2, 3, 4): each is refused as ``FrozenError`` and changes neither a byte nor the
allocator; a holder that is not the owner is refused as ``OwnerError`` at every refcount.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

import pytest
import torch

from refimpl.api import State
from refimpl.blocks import BlockStatus
from refimpl.checksum import byte_view
from refimpl.chunks import freeze
from refimpl.errors import CancelledError, FrozenError, IncompleteError, InUseError, OwnerError
from refimpl.pool import KVPool, PoolGeometry, copy_blocks
from tests.library.lib_helpers import held
from tests.refimpl.test_transport_chunks import LOCAL, deliver, sent

HOLDERS = ("r#pfx", "pin", "r@store")  # a prefix share, a transfer's pin, a store
SETS = [c for k in range(len(HOLDERS) + 1) for c in combinations(HOLDERS, k)]
Writer = Callable[[KVPool, str, int, torch.Tensor], None]


def _copy_into(pool: KVPool, holder: str, b: int, src: torch.Tensor) -> None:
    other = KVPool(2, pool.geometry)
    [s] = other.allocator.allocate("x", 1)
    other.write_block("x", s, src)
    copy_blocks(other, [s], pool, [b], holder)


WRITERS: dict[str, Writer] = {
    "write_block": lambda p, h, b, src: p.write_block(h, b, src),
    "write_blocks": lambda p, h, b, src: p.write_blocks(h, [b], src[None]),
    "write_block_bytes": lambda p, h, b, src: p.write_block_bytes(h, b, byte_view(src)),
    "copy_blocks": _copy_into,
}


def _pool_with(holders: tuple[str, ...]) -> tuple[KVPool, int]:
    pool = KVPool(4, PoolGeometry.of_local(LOCAL))
    [b] = pool.allocator.allocate("r", 1)
    pool.write_block("r", b, torch.ones(pool.geometry.block_shape).half())
    for h in holders:
        if h == "pin":
            freeze(pool, "r", 1)  # what a transfer takes: the snapshot's pin
        else:
            pool.allocator.incref(h, [b])
    return pool, b


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("holders", SETS, ids=lambda s: "+".join(s) or "owner-only")
def test_a_write_lands_only_on_a_block_held_once(writer: str, holders: tuple[str, ...]) -> None:
    pool, b = _pool_with(holders)
    assert pool.allocator.refcount(b) == 1 + len(holders)
    new = torch.full(pool.geometry.block_shape, 7.0).half()
    before, state = pool.kv[b].clone(), pool.allocator.counts()
    if holders:
        with pytest.raises(FrozenError, match=f"refcount {1 + len(holders)}"):
            WRITERS[writer](pool, "r", b, new)
        assert torch.equal(pool.kv[b], before) and pool.allocator.counts() == state
    else:
        WRITERS[writer](pool, "r", b, new)
        assert torch.equal(pool.kv[b], new)
    with pytest.raises(OwnerError):  # not the owner: refused whatever the refcount
        WRITERS[writer](pool, "q", b, new)
    pool.allocator.check_integrity()


@pytest.mark.parametrize("end", ["receiver abort", "sender abort"])
@pytest.mark.parametrize("point", [0, 1, 2])  # chunks installed before the end
def test_the_receiver_ends_at_every_point(end: str, point: int) -> None:
    """Install ``point`` of the 3 chunks, then end the attempt: every reserved block goes
    back to the pool, and no chunk delivered after the end (all of them again) lands,
    counts or commits."""
    p, chunks = sent(12)
    targets = p.dst.alloc.blocks_of("r")
    deliver(p, chunks[:point])
    assert p.rx.state("r") is State.RECEIVING
    if end == "receiver abort":
        p.rx.abort("r", "cancelled")
    else:
        p.tx.abort("r", "cancelled")
        p.rx.poll("r")
    assert p.rx.state("r") is State.ABORTED and held(p.dst) == {}
    assert all(p.dst.alloc.status(b) is BlockStatus.FREE for b in targets)
    before = p.dst.pools[0].kv[torch.tensor(targets)].clone()
    deliver(p, chunks)  # every chunk again, those installed before the end included
    assert p.rx.state("r") is State.ABORTED and held(p.dst) == {}
    assert torch.equal(p.dst.pools[0].kv[torch.tensor(targets)], before)  # nothing landed
    with pytest.raises(CancelledError):
        p.rx.result("r")


@pytest.mark.parametrize("point", [0, 1, 2])
def test_an_incomplete_receiver_never_commits_and_its_blocks_cannot_be_shared(point: int) -> None:
    p, chunks = sent(12)
    deliver(p, chunks[:point])
    assert p.rx.state("r") is State.RECEIVING
    with pytest.raises(InUseError, match="not finished"):
        p.rx.result("r")
    with pytest.raises(IncompleteError):  # a reserved block is not a prefix to share
        p.dst.alloc.incref("r2#pfx", [p.dst.alloc.blocks_of("r")[0]])
