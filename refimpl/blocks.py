"""Block bookkeeping for one pool: free list, refcounts, owner, epoch, quarantine (no torch).

Every block is in exactly one status:

    FREE         on the free list; refcount 0, no owner
    RESERVED     set aside for an incoming transfer; only its owner holds it, bytes may be
                 landing, nobody may read, share or free it (quarantine it instead)
    OWNED        valid bytes; held by >= 1 holders (owner, prefix sharers, transfer pins)
    QUARANTINED  released by its request while a writer may still land bytes; refcount 0,
                 owner kept, not reusable until ``unquarantine_and_free`` says the writer
                 stopped

A *holder* is any string: a request id, or a transfer's pin on its source blocks (for
example ``"req-1@pin3"``). ``refcount[b]`` is the number of holder tables listing ``b``,
so a transfer that increfs its source blocks keeps them alive (and read-only) even after
the request frees them. ``check_integrity`` states the conservation law:

    free + reserved + owned + quarantined == capacity,  refcount[b] == #tables holding b

Queries pair with commands (``can_allocate``/``allocate``, ``can_write``/``check_write``).
A refused command raises an ``OwnershipError`` naming the property and changes nothing.
Guards can be disabled by property ID to re-introduce a known bug (mutant switches).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from enum import Enum

from refimpl.errors import (
    CapacityError,
    FrozenError,
    IncompleteError,
    IntegrityError,
    InUseError,
    OwnerError,
    RefcountError,
    StaleError,
)

GUARDS = (
    "NoReuseUnderIO",
    "CapacityRefcount",
    "NoPartialUse",
    "FrozenSnapshot",
    "SingleWriter",
    "Fencing",
)


class BlockStatus(Enum):
    FREE = "free"
    RESERVED = "reserved"
    OWNED = "owned"
    QUARANTINED = "quarantined"


class BlockAllocator:
    def __init__(self, capacity: int, *, disabled_guards: Iterable[str] = ()) -> None:
        if capacity < 0:
            raise ValueError(f"capacity={capacity} must be >= 0")
        self.disabled_guards = frozenset(disabled_guards)
        if unknown := self.disabled_guards - set(GUARDS):
            raise ValueError(f"unknown guards {sorted(unknown)}; known: {GUARDS}")
        self.capacity = capacity
        self._free: deque[int] = deque(range(capacity))  # allocation order: left first
        # ids taken by id (an engine's scheduler chose them) still in ``_free``: skipped
        # when popped, dropped by ``_compact`` (a block's stale entries precede its live one)
        self._stale: Counter[int] = Counter()
        self._nstale = 0
        self._status = [BlockStatus.FREE] * capacity
        self._refcount = [0] * capacity
        self._owner: list[str | None] = [None] * capacity  # the one writer, while held
        self._epoch = [-1] * capacity  # attempt that allocated the block, -1 when free
        self._tables: dict[str, list[int]] = {}  # holder -> block ids, logical order
        self._quarantine: dict[int, tuple[str, int]] = {}  # block -> (owner, epoch)

    def _guarded(self, prop: str) -> bool:
        return prop not in self.disabled_guards

    # ------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        return len(self._free) - self._nstale

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self.num_free

    def free_list(self) -> list[int]:
        """The free blocks in allocation order (O(capacity))."""
        skip, out = Counter(self._stale), []
        for b in self._free:
            if skip[b]:
                skip[b] -= 1
            else:
                out.append(b)
        return out

    def blocks_of(self, holder: str) -> tuple[int, ...]:
        return tuple(self._tables.get(holder, ()))

    def holders(self) -> tuple[str, ...]:
        return tuple(self._tables)

    def status(self, block: int) -> BlockStatus:
        return self._status[block]

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def owner(self, block: int) -> str | None:
        return self._owner[block]

    def epoch(self, block: int) -> int:
        return self._epoch[block]

    def quarantined(self, owner: str | None = None) -> tuple[int, ...]:
        return tuple(b for b, (o, _) in self._quarantine.items() if owner in (None, o))

    def counts(self) -> dict[str, int]:
        c = Counter(s.value for s in self._status)
        return {s.value: c[s.value] for s in BlockStatus}

    def can_write(self, holder: str, block: int) -> bool:
        try:
            self.check_write(holder, [block])
        except (OwnerError, FrozenError, InUseError):
            return False
        return True

    def check_write(self, holder: str, blocks: Iterable[int]) -> None:
        """Refuse unless ``holder`` is the one writer of every block and nobody else holds it."""
        for b in blocks:
            st = self._status[b]
            if st not in (BlockStatus.RESERVED, BlockStatus.OWNED):
                raise InUseError(f"write to block {b} in status {st.value}")
            if self._owner[b] != holder and self._guarded("SingleWriter"):
                raise OwnerError(f"{holder!r} writes block {b} owned by {self._owner[b]!r}")
            if self._refcount[b] > 1 and self._guarded("FrozenSnapshot"):
                raise FrozenError(
                    f"block {b} is pinned or shared (refcount {self._refcount[b]}); it is read-only"
                )

    # ------------------------------------------------------------ commands
    def allocate(self, owner: str, n: int, *, epoch: int = 0) -> list[int]:
        """Take ``n`` free blocks as OWNED by ``owner`` (written locally, e.g. by prefill)."""
        return self._take(owner, n, epoch, BlockStatus.OWNED)

    def reserve(self, owner: str, n: int, *, epoch: int) -> list[int]:
        """Take ``n`` free blocks as RESERVED destinations of attempt ``epoch``."""
        return self._take(owner, n, epoch, BlockStatus.RESERVED)

    def allocate_ids(self, owner: str, ids: Iterable[int], *, epoch: int = 0) -> list[int]:
        """``allocate`` of the given free blocks (an engine's scheduler chose the ids)."""
        return self._take_ids(owner, list(ids), epoch, BlockStatus.OWNED)

    def reserve_ids(self, owner: str, ids: Iterable[int], *, epoch: int) -> list[int]:
        """``reserve`` of the given free blocks (an engine's scheduler chose the ids)."""
        return self._take_ids(owner, list(ids), epoch, BlockStatus.RESERVED)

    def check_ids(self, ids: Iterable[object], what: str = "block ids") -> list[int]:
        """``ids`` as a list, or ValueError naming each one that is not an id of this
        table (not an int, out of range) and each duplicate."""
        ids = list(ids)
        bad = [b for b in ids if type(b) is not int or not 0 <= b < self.capacity]
        if bad:
            raise ValueError(f"{what}: {bad!r:.200} not block ids 0..{self.capacity - 1}")
        dups = sorted(b for b, k in Counter(ids).items() if k > 1)  # type: ignore[type-var]
        if dups:
            raise ValueError(f"{what}: {dups!r:.200} given twice")
        return ids  # type: ignore[return-value]

    def _take_ids(self, owner: str, ids: list[int], epoch: int, status: BlockStatus) -> list[int]:
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0")
        self.check_ids(ids, f"{owner!r}'s block ids")
        if busy := [b for b in ids if self._status[b] is not BlockStatus.FREE]:
            raise InUseError(
                f"{owner!r} takes blocks {busy} that are not free here: "
                + ", ".join(f"{b} {self._status[b].value} by {self._owner[b]!r}" for b in busy)
            )
        self._stale.update(ids)  # O(len(ids)): their free-list entries go stale
        self._nstale += len(ids)
        if self._nstale > max(64, len(self._free) // 2):
            self._compact()
        return self._hold(owner, ids, epoch, status)

    def _compact(self) -> None:
        self._free = deque(self.free_list())
        self._stale.clear()
        self._nstale = 0

    def _pop_free(self) -> int:
        while True:
            b = self._free.popleft()
            k = self._stale.get(b, 0)
            if not k:
                return b
            self._nstale -= 1  # a stale entry: the block was taken by id since
            if k == 1:
                del self._stale[b]
            else:
                self._stale[b] = k - 1

    def _take(self, owner: str, n: int, epoch: int, status: BlockStatus) -> list[int]:
        if n < 0 or epoch < 0:
            raise ValueError(f"n={n} and epoch={epoch} must be >= 0")
        if not self.can_allocate(n):
            raise CapacityError(
                f"{owner!r} asks for {n} blocks, {self.num_free} free of {self.capacity}"
            )
        return self._hold(owner, [self._pop_free() for _ in range(n)], epoch, status)

    def _hold(self, owner: str, got: list[int], epoch: int, status: BlockStatus) -> list[int]:
        for b in got:
            self._status[b], self._refcount[b] = status, 1
            self._owner[b], self._epoch[b] = owner, epoch
        if got:
            self._tables.setdefault(owner, []).extend(got)
        return got

    def commit(self, owner: str, epoch: int) -> list[int]:
        """RESERVED -> OWNED for the owner's blocks of attempt ``epoch`` (zero blocks is fine)."""
        mine = [b for b in self._tables.get(owner, ()) if self._status[b] is BlockStatus.RESERVED]
        stale = [b for b in mine if self._epoch[b] != epoch]
        if stale and self._guarded("Fencing"):
            raise StaleError(
                f"commit of {owner!r} epoch {epoch}, but blocks {stale} were "
                f"reserved by epochs {[self._epoch[b] for b in stale]}"
            )
        for b in mine:
            self._status[b] = BlockStatus.OWNED
        return mine

    def incref(self, holder: str, blocks: Iterable[int]) -> None:
        """``holder`` takes a reference (prefix sharing, or a transfer pinning its source)."""
        blocks = list(blocks)
        for b in blocks:
            st = self._status[b]
            if st is BlockStatus.RESERVED and self._guarded("NoPartialUse"):
                raise IncompleteError(f"block {b} is reserved (not validated); cannot share")
            if st in (BlockStatus.FREE, BlockStatus.QUARANTINED):
                raise RefcountError(f"block {b} is {st.value}; nothing to reference")
        for b in blocks:
            self._refcount[b] += 1
        if blocks:
            self._tables.setdefault(holder, []).extend(blocks)

    def decref(self, holder: str, blocks: Iterable[int]) -> list[int]:
        """Drop ``holder``'s references; blocks reaching zero are freed and returned."""
        blocks = list(blocks)
        table = self._tables.get(holder, [])
        held, asked = Counter(table), Counter(blocks)
        if self._guarded("CapacityRefcount"):
            missing = sorted(b for b, k in asked.items() if held[b] < k)
            if missing:
                raise RefcountError(f"{holder!r} releases blocks {missing} it does not hold")
        reserved = [b for b in blocks if self._status[b] is BlockStatus.RESERVED]
        if reserved and self._guarded("NoReuseUnderIO"):
            raise InUseError(
                f"blocks {reserved} of {holder!r} are transfer destinations; "
                "quarantine them until the writer has stopped"
            )
        freed = []
        for b in blocks:
            if b in table:
                table.remove(b)
            self._refcount[b] -= 1
            if self._refcount[b] == 0:
                self._release(b)
                freed.append(b)
        if holder in self._tables and not table:
            del self._tables[holder]
        return freed

    def free(self, holder: str) -> list[int]:
        """Drop every reference ``holder`` has; returns the blocks that became free."""
        return self.decref(holder, list(self._tables.get(holder, ())))

    def quarantine(self, owner: str) -> list[int]:
        """Release a request whose reserved blocks may still receive bytes.

        Its RESERVED blocks go to quarantine (not reusable); its other references are
        dropped as by ``free``. Returns the quarantined block ids.
        """
        table = self._tables.get(owner, [])
        held = [b for b in table if self._status[b] is not BlockStatus.RESERVED]
        if self._guarded("CapacityRefcount"):
            self._check_held(owner, held)
        moved = [b for b in table if self._status[b] is BlockStatus.RESERVED]
        for b in moved:
            self._status[b], self._refcount[b] = BlockStatus.QUARANTINED, 0
            self._quarantine[b] = (owner, self._epoch[b])
        self._tables[owner] = held
        self.decref(owner, held)
        self._tables.pop(owner, None)
        return moved

    def unquarantine_and_free(self, owner: str, epoch: int | None = None) -> list[int]:
        """The writer into ``owner``'s quarantined blocks has stopped: free them."""
        done = [b for b, (o, e) in self._quarantine.items() if o == owner and epoch in (None, e)]
        for b in done:
            del self._quarantine[b]
            self._release(b)
        return done

    def _check_held(self, holder: str, blocks: list[int]) -> None:
        bad = [b for b in blocks if self._refcount[b] < 1]
        if bad:
            raise RefcountError(f"{holder!r} holds blocks {bad} whose refcount is < 1")

    def _release(self, b: int) -> None:
        self._status[b], self._owner[b], self._epoch[b] = BlockStatus.FREE, None, -1
        self._refcount[b] = 0
        self._free.append(b)

    # ------------------------------------------------------------ the conservation law
    def check_integrity(self) -> None:
        """O(capacity + table sizes). Raises IntegrityError printing every quantity."""
        counts = self.counts()
        in_tables: Counter[int] = Counter()
        for blocks in self._tables.values():
            in_tables.update(blocks)
        problems: list[str] = []
        if sum(counts.values()) != self.capacity:
            problems.append("statuses do not partition the capacity")
        free = self.free_list()
        if len(free) != len(set(free)) or len(free) != self.num_free:
            problems.append(f"free list has duplicates: {sorted(free)}")
        if set(free) != {b for b, s in enumerate(self._status) if s is BlockStatus.FREE}:
            problems.append("free list != blocks in status free")
        if set(self._quarantine) != {
            b for b, s in enumerate(self._status) if s is BlockStatus.QUARANTINED
        }:
            problems.append("quarantine map != blocks in status quarantined")
        for b, st in enumerate(self._status):
            rc, held, owner = self._refcount[b], in_tables[b], self._owner[b]
            if rc != held or rc < 0:
                problems.append(f"block {b} ({st.value}): refcount {rc} but in {held} tables")
            live = st in (BlockStatus.RESERVED, BlockStatus.OWNED)
            if live != (rc > 0) or (st is BlockStatus.FREE) != (owner is None):
                problems.append(f"block {b} ({st.value}): refcount {rc}, owner {owner!r}")
            if st is BlockStatus.RESERVED and b not in self._tables.get(owner or "", ()):
                problems.append(f"block {b} reserved but not held by its owner {owner!r}")
        if problems:
            raise IntegrityError(
                f"capacity={self.capacity} free={counts['free']} reserved={counts['reserved']} "
                f"owned={counts['owned']} quarantined={counts['quarantined']} "
                f"sum={sum(counts.values())} free_list={len(free)} "
                f"table_refs={sum(in_tables.values())} "
                f"refcount_sum={sum(self._refcount)}: " + "; ".join(problems)
            )
