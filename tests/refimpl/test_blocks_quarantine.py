"""The allocator's quarantine and its edges: a quarantined block is freed only for the
attempt whose writer stopped, a free block belongs to no attempt (epoch -1), and the
conservation check sees a free list that names a block twice."""

from __future__ import annotations

import pytest

from refimpl.blocks import BlockAllocator, BlockStatus
from refimpl.errors import IntegrityError, RefcountError


def test_a_free_block_belongs_to_no_attempt() -> None:
    a = BlockAllocator(4)
    assert [a.epoch(b) for b in range(4)] == [-1] * 4
    got = a.reserve("r", 2, epoch=0)
    assert [a.epoch(b) for b in got] == [0, 0]  # epoch 0 is an attempt, not "free"
    a.quarantine("r")
    a.unquarantine_and_free("r")
    assert [a.epoch(b) for b in range(4)] == [-1] * 4
    a.check_integrity()


@pytest.mark.parametrize(("n", "epoch"), [(-1, 0), (1, -1)])
def test_negative_counts_and_epochs_are_refused(n: int, epoch: int) -> None:
    a = BlockAllocator(4)
    with pytest.raises(ValueError, match="must be >= 0"):
        a.reserve("r", n, epoch=epoch)
    assert a.num_free == 4


def test_only_the_stopped_attempts_quarantined_blocks_are_freed() -> None:
    """Attempt 1 and attempt 2 of one request both left blocks that a late write may
    still reach; attempt 1's writer stopped, attempt 2's has not."""
    a = BlockAllocator(6)
    first = a.reserve("r", 2, epoch=1)
    a.quarantine("r")
    second = a.reserve("r", 2, epoch=2)
    a.quarantine("r")
    assert sorted(a.unquarantine_and_free("r", 1)) == sorted(first)
    assert sorted(a.quarantined("r")) == sorted(second)
    assert all(a.status(b) is BlockStatus.QUARANTINED for b in second)
    assert a.num_free == 4
    assert sorted(a.unquarantine_and_free("r", 2)) == sorted(second)
    assert a.num_free == 6
    a.check_integrity()


def test_quarantine_frees_what_the_request_holds_and_keeps_what_it_reserved() -> None:
    a = BlockAllocator(6)
    owned = a.allocate("r", 2)  # refcount 1 each: held, and fine
    reserved = a.reserve("r", 2, epoch=1)
    assert sorted(a.quarantine("r")) == sorted(reserved)
    assert all(a.status(b) is BlockStatus.FREE for b in owned)
    assert a.holders() == () and a.num_free == 4
    a.check_integrity()


def test_quarantine_refuses_a_held_block_whose_refcount_is_gone() -> None:
    a = BlockAllocator(4)
    owned = a.allocate("r", 2)
    a._refcount[owned[0]] = 0  # corruption: held in r's table, counted by nobody
    with pytest.raises(RefcountError, match="refcount is < 1"):
        a.quarantine("r")


def test_integrity_sees_a_block_twice_on_the_free_list() -> None:
    a = BlockAllocator(4)
    a._free.append(a._free[0])
    with pytest.raises(IntegrityError, match="free list has duplicates"):
        a.check_integrity()
