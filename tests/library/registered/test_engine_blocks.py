"""Blocks taken by id (an engine's scheduler chose them) beside blocks allocated by count:
the free list keeps its order and its content, against a plain model of it, whatever the
mix; ``check_integrity`` holds after every step."""

from __future__ import annotations

import random

import pytest

from refimpl.blocks import BlockAllocator
from refimpl.memory.engine_blocks import EngineBlocks


@pytest.mark.parametrize("seed", range(40))
def test_taking_ids_keeps_the_free_list_in_order(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.randint(1, 40)
    alloc, free, held = BlockAllocator(cap), list(range(cap)), {}  # the model: an ordered list
    for step in range(80):
        op = rng.random()
        if op < 0.35 and (n := rng.randint(0, 5)) <= len(free):
            got = alloc.allocate(f"n{step}", n)
            assert got == free[:n]
            free, held[f"n{step}"] = free[n:], got
        elif op < 0.7:
            ids = rng.sample(free, min(len(free), rng.randint(0, 4)))
            assert alloc.reserve_ids(f"i{step}", ids, epoch=1) == ids
            free, held[f"i{step}"] = [b for b in free if b not in ids], ids
        elif held:
            h = rng.choice(sorted(held))
            if h.startswith("n"):  # allocated: freed; reserved: quarantined, then freed
                free += alloc.free(h)
            else:
                assert alloc.quarantine(h) == held[h]
                free += alloc.unquarantine_and_free(h)
            del held[h]
        assert alloc.num_free == len(free) and alloc.free_list() == free
        alloc.check_integrity()


def test_an_engines_table_stays_bounded_over_many_requests() -> None:
    alloc = EngineBlocks(1000)
    for i in range(5000):
        ids = [(7 * i + k) % 1000 for k in range(8)]
        alloc.adopt(f"r{i}", ids)
        assert alloc.release(f"r{i}") == tuple(ids)
    assert len(alloc._free) <= 1000 + max(64, 1000 // 2)  # noqa: SLF001 - stale entries compacted
    assert alloc.num_free == 1000 and sorted(alloc.free_list()) == list(range(1000))
    alloc.check_integrity()
