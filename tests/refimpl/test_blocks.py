"""Block bookkeeping: narrated scenarios with exact block ids, refusals, guards, the law."""

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.blocks import GUARDS, BlockAllocator, BlockStatus
from refimpl.errors import (
    CapacityError,
    FrozenError,
    IncompleteError,
    IntegrityError,
    InUseError,
    OwnerError,
    OwnershipError,
    RefcountError,
    StaleError,
)


def state(a: BlockAllocator) -> dict[str, Any]:
    return copy.deepcopy(vars(a))


def test_scenario_prefill_then_decode_reserve_commit_free() -> None:
    a = BlockAllocator(4)
    assert a.allocate("P", 2) == [0, 1]  # prefill writes its KV locally
    assert a.reserve("D", 2, epoch=1) == [2, 3]  # destination of an incoming handoff
    assert not a.can_allocate(1) and a.num_free == 0
    assert a.counts() == {"free": 0, "reserved": 2, "owned": 2, "quarantined": 0}
    assert a.commit("D", epoch=1) == [2, 3]
    assert a.status(2) is BlockStatus.OWNED and a.epoch(3) == 1
    assert a.free("P") == [0, 1]
    assert a.allocate("Q", 1) == [0]  # freed blocks rejoin the list in order
    a.check_integrity()


def test_prefix_sharing_frees_only_at_zero() -> None:
    a = BlockAllocator(3)
    assert a.allocate("A", 2) == [0, 1]
    a.incref("B", [0])  # B reuses A's first (full, immutable) block
    assert a.refcount(0) == 2 and a.blocks_of("B") == (0,)
    assert a.free("A") == [1]  # block 0 survives: B still holds it
    assert a.status(0) is BlockStatus.OWNED and a.owner(0) == "A"
    assert a.free("B") == [0]
    assert a.counts()["free"] == 3
    a.check_integrity()


def test_transfer_pin_keeps_source_alive_and_read_only() -> None:
    a = BlockAllocator(2)
    a.allocate("R", 2)
    assert a.can_write("R", 0)
    a.incref("R@pin1", [0, 1])  # freeze: the handoff pins its source
    assert not a.can_write("R", 0)
    with pytest.raises(FrozenError):
        a.check_write("R", [0])
    assert a.free("R") == []  # the request lets go; the pin still holds the bytes
    assert a.decref("R@pin1", [0, 1]) == [0, 1]
    a.check_integrity()


def test_cancel_mid_transfer_quarantines_until_writer_stops() -> None:
    """Incident vllm#32255: an abort must not free blocks under an in-flight read."""
    a = BlockAllocator(2)
    assert a.reserve("A", 2, epoch=1) == [0, 1]
    with pytest.raises(InUseError) as info:
        a.free("A")
    assert info.value.prop == "NoReuseUnderIO"
    assert a.quarantine("A") == [0, 1]
    assert a.quarantined("A") == (0, 1) and a.blocks_of("A") == ()
    with pytest.raises(CapacityError):
        a.allocate("C", 1)  # nothing reusable while the writer may land bytes
    a.check_integrity()
    assert a.unquarantine_and_free("A", epoch=1) == [0, 1]
    assert a.allocate("C", 2) == [0, 1]
    a.check_integrity()


def test_guard_disabled_reproduces_the_incident() -> None:
    a = BlockAllocator(2, disabled_guards={"NoReuseUnderIO"})
    a.reserve("A", 2, epoch=1)
    assert a.free("A") == [0, 1]  # the bug: freed under an in-flight read
    assert a.allocate("C", 2) == [0, 1]  # ... and handed to C, whose KV will be overwritten
    a.check_integrity()  # bookkeeping stays consistent; only the protocol is wrong


def test_double_release_caught_by_guard_or_by_the_law() -> None:
    for disabled in ((), ("CapacityRefcount",)):
        a = BlockAllocator(2, disabled_guards=disabled)
        a.allocate("A", 1)
        a.incref("B", [0])
        a.decref("B", [0])
        if not disabled:
            with pytest.raises(RefcountError):
                a.decref("B", [0])
            a.check_integrity()
        else:
            a.decref("B", [0])  # released twice: A's block now looks free-able
            with pytest.raises(IntegrityError) as info:
                a.check_integrity()
            msg = str(info.value)
            for quantity in ("capacity=2", "free=", "owned=", "sum=", "refcount 0 but in 1"):
                assert quantity in msg, msg


def test_guards_are_named_by_property() -> None:
    with pytest.raises(ValueError, match="unknown guards"):
        BlockAllocator(1, disabled_guards={"Nope"})
    a = BlockAllocator(2, disabled_guards=set(GUARDS))
    a.allocate("A", 1)
    a.incref("pin", [0])
    assert a.can_write("someone-else", 0)  # SingleWriter and FrozenSnapshot off


def test_integrity_reports_every_quantity() -> None:
    a = BlockAllocator(3)
    a.allocate("A", 2)
    a._refcount[1] += 1  # simulate a lost table entry
    a._free.append(0)  # and a block both free-listed and owned
    with pytest.raises(IntegrityError) as info:
        a.check_integrity()
    msg = str(info.value)
    assert "capacity=3 free=1 reserved=0 owned=2 quarantined=0 sum=3 free_list=2" in msg
    assert "block 1 (owned): refcount 2 but in 1 tables" in msg
    assert "free list != blocks in status free" in msg
    assert info.value.prop == "CapacityRefcount"


def _setup() -> BlockAllocator:
    a = BlockAllocator(4)
    a.allocate("A", 2)  # [0, 1]
    a.reserve("D", 1, epoch=2)  # [2]
    a.incref("A@pin1", [1])
    return a


REFUSALS: list[tuple[str, Callable[[BlockAllocator], object], type[OwnershipError], str]] = [
    ("over capacity", lambda a: a.allocate("X", 2), CapacityError, "CapacityRefcount"),
    ("release unheld", lambda a: a.decref("X", [0]), RefcountError, "CapacityRefcount"),
    (
        "release twice in one call",
        lambda a: a.decref("A", [0, 0]),
        RefcountError,
        "CapacityRefcount",
    ),
    ("free under I/O", lambda a: a.free("D"), InUseError, "NoReuseUnderIO"),
    ("share a partial replica", lambda a: a.incref("X", [2]), IncompleteError, "NoPartialUse"),
    ("reference a free block", lambda a: a.incref("X", [3]), RefcountError, "CapacityRefcount"),
    ("commit another epoch", lambda a: a.commit("D", epoch=1), StaleError, "Fencing"),
    ("write by non-owner", lambda a: a.check_write("X", [0]), OwnerError, "SingleWriter"),
    ("write a pinned block", lambda a: a.check_write("A", [1]), FrozenError, "FrozenSnapshot"),
    ("write a free block", lambda a: a.check_write("A", [3]), InUseError, "NoReuseUnderIO"),
]


@pytest.mark.parametrize("name,cmd,err,prop", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusal_changes_nothing(
    name: str, cmd: Callable[[BlockAllocator], object], err: type[OwnershipError], prop: str
) -> None:
    a = _setup()
    before = state(a)
    with pytest.raises(err) as info:
        cmd(a)
    assert info.value.prop == prop and prop in str(info.value)
    assert state(a) == before
    a.check_integrity()


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "allocate",
                "reserve",
                "commit",
                "incref",
                "decref",
                "free",
                "quarantine",
                "unquarantine",
            ]
        ),
        st.sampled_from(["A", "B", "C"]),
        st.integers(0, 3),
        st.integers(0, 5),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_random_commands_keep_the_law(ops: list[tuple[str, str, int, int]]) -> None:
    a = BlockAllocator(5)
    for op, who, n, b in ops:
        before = state(a)
        try:
            if op == "allocate":
                a.allocate(who, n)
            elif op == "reserve":
                a.reserve(who, n, epoch=n)
            elif op == "commit":
                a.commit(who, epoch=n)
            elif op == "incref":
                a.incref(who, [b % 5])
            elif op == "decref":
                a.decref(who, [b % 5])
            elif op == "free":
                a.free(who)
            elif op == "quarantine":
                a.quarantine(who)
            else:
                a.unquarantine_and_free(who)
        except OwnershipError:
            assert state(a) == before, op
        a.check_integrity()
