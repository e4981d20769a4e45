"""``EngineBlocks``: the block table of an engine's registered memory (no torch).

The engine's scheduler owns the block ids: kvown never picks one (``allocate(n)`` and
``reserve(n)`` are refused) and never frees one. It is told which blocks a request
holds, and says when each may be freed or reused, from the ownership states the
``BlockAllocator`` already tracks:

    adopt(rid, ids)        the source: these engine blocks hold rid's KV (OWNED by rid);
                           a Sender pins what it sends, and drops the pin at the ack
                           (or at any other end of the attempt)
    reserve_ids(rid, ids)  the destination, at the manifest (``Receiver.expect(blocks=)``):
                           RESERVED for the attempt; OWNED by rid at the commit; given
                           back (quarantined until the writer stopped, then free) on any
                           failure
    freeable(rid)          those of rid's engine blocks that kvown no longer touches:
                           free in this table, or held by rid alone (no transfer's pin,
                           not reserved, not quarantined)
    release(rid)           the engine frees rid's blocks: refused (``InUseError``, naming
                           each block and why) while one is not freeable; then the
                           table forgets them and the ids are the engine's again

So a source block is freeable only once the receiver acked (vLLM's delayed free), a
destination block at the commit, or once the attempt failed and its writer stopped.
"""

from __future__ import annotations

from collections.abc import Iterable

from refimpl.blocks import BlockAllocator, BlockStatus
from refimpl.errors import CapacityError, InUseError


class EngineBlocks(BlockAllocator):
    """A ``BlockAllocator`` over an engine's block ids, which the engine chooses."""

    def __init__(self, capacity: int, *, disabled_guards: Iterable[str] = ()) -> None:
        super().__init__(capacity, disabled_guards=disabled_guards)
        self._given: dict[str, tuple[int, ...]] = {}  # rid -> the engine's ids for it

    def allocate(self, owner: str, n: int, *, epoch: int = 0) -> list[int]:
        raise CapacityError(
            f"{owner!r}: registered memory: the engine's scheduler chooses block ids "
            "(adopt(rid, ids) for blocks it wrote), kvown allocates none"
        )

    def reserve(self, owner: str, n: int, *, epoch: int) -> list[int]:
        raise CapacityError(
            f"{owner!r}: registered memory: the engine's scheduler chooses the destination "
            "blocks; give them with Receiver.expect(rid, blocks=ids)"
        )

    def given(self, owner: str) -> tuple[int, ...]:
        """The engine's block ids for ``owner`` (adopted or reserved), until ``release``."""
        return self._given.get(owner, ())

    def adopt(self, owner: str, ids: Iterable[int]) -> list[int]:
        """The engine's blocks ``ids`` hold ``owner``'s KV: OWNED by it here (refused,
        changing nothing, for an id out of range, twice, or held by anyone)."""
        got = self.allocate_ids(owner, ids)
        self._given[owner] = (*self._given.get(owner, ()), *got)
        return got

    def reserve_ids(self, owner: str, ids: Iterable[int], *, epoch: int) -> list[int]:
        got = super().reserve_ids(owner, ids, epoch=epoch)
        self._given[owner] = (*self._given.get(owner, ()), *got)
        return got

    def _busy(self, owner: str) -> dict[int, str]:
        """Each of ``owner``'s engine blocks kvown still touches, with why."""
        mine = set(self.blocks_of(owner))
        out = {}
        for b in self._given.get(owner, ()):
            st = self.status(b)
            if st is BlockStatus.FREE:
                continue
            if st is BlockStatus.OWNED and b in mine and self.refcount(b) == 1:
                continue
            if st is BlockStatus.OWNED and b in mine:
                out[b] = f"pinned by a transfer (refcount {self.refcount(b)})"
            elif st is BlockStatus.OWNED:
                out[b] = f"held by {self.owner(b)!r}, not {owner!r}"
            else:
                out[b] = st.value  # reserved: a writer may land bytes; quarantined: too
        return out

    def freeable(self, owner: str) -> tuple[int, ...]:
        """``owner``'s engine blocks that kvown no longer touches (the engine's to free
        or reuse), in the order given."""
        busy = self._busy(owner)
        return tuple(b for b in self._given.get(owner, ()) if b not in busy)

    def release(self, owner: str) -> tuple[int, ...]:
        """The engine frees ``owner``'s blocks; returns their ids. Refused while kvown
        still touches one (``InUseError`` naming each), changing nothing."""
        if busy := self._busy(owner):
            raise InUseError(
                f"{owner!r}: blocks not freeable yet: "
                + ", ".join(f"{b} ({why})" for b, why in sorted(busy.items()))
            )
        self.free(owner)
        return self._given.pop(owner, ())
