"""The torch reference engine as a ``testing.harness.Adapter``: what the Hypothesis
machine (``refimpl.testing.machine``) drives by default."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from refimpl.engine import STREAM_SWITCH, Engine
from refimpl.errors import OwnershipError
from refimpl.testing.ghost import Ghost
from spec.config import CONFIGS, Config
from spec.mutants import MUTANTS
from spec.state import COMPLETE

__all__ = ["EngineAdapter", "EngineSubject"]


class EngineSubject:
    """``refimpl.engine.Engine`` seen through the ``Subject`` protocol."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.step = engine.step
        self.abstract = engine.abstract
        self.check_integrity = engine.check_integrity
        self.data_problems = engine.damaged  # byte equality with the engine's own truth
        self.snapshot = engine.fingerprint  # allocators, pool bytes, wire, records
        self.replica = engine.replica  # what the harness's ghost reads (``ghost.py``)

    def ghost(self) -> Ghost:
        """The harness's content oracle for this engine (``ghost.py``): it takes the
        model's geometry and seed from the engine, and nothing else."""
        e, c = self.engine, self.engine.config
        return Ghost(
            n_reqs=c.n_reqs,
            blocks=c.blocks,
            prefix=c.prefix,
            block_shape=e.block_shape_full,
            dtype=e.dtype,
            seed=e.seed,
            read=e.replica,
            shared_prompt=bool(c.host_cache),
        )

    def held_blocks(self) -> dict[str, int]:
        """Blocks held per pool, the prefix cache's own blocks left out (for the drain), and
        the shared host cache's published copy (a cache outlives its requests)."""
        e = self.engine
        held = {
            k: p.alloc.capacity - p.alloc.num_free
            for k, p in zip("PHD", (e.P, e.H, e.D), strict=True)
        }
        held["D"] -= len(e.prefix_blocks)
        if e.hc_status() == COMPLETE:
            held["H"] -= len(e.hc_blocks())
        return held


def permute_free_lists(engine: Engine, seed: int) -> None:
    """Hand out block ids in a seeded random order (not 0, 1, 2, ...): every block table
    the engine builds is then non-contiguous and permuted, as in a long-running server."""
    rng = random.Random(seed)
    for pools in (engine.P, engine.H, engine.D):
        free = list(pools.alloc._free)  # noqa: SLF001 - the allocator's order is the point
        rng.shuffle(free)
        pools.alloc._free = deque(free)  # noqa: SLF001


@dataclass
class EngineAdapter:
    """The torch reference engine (tiny tensors: block size 2, head dim 4, two layers)."""

    device: str | None = None  # None: the engine's default (CUDA when present)
    name: str = "refimpl.engine"
    refusals: tuple[type[BaseException], ...] = (OwnershipError,)
    randoms: tuple[random.Random, ...] = ()  # the engine seeds torch generators only

    permute: bool = True  # permuted, non-contiguous block ids (``permute_free_lists``)

    def build(self, config: Config, mutants: frozenset[str], seed: int) -> EngineSubject:
        engine = Engine(config, seed=seed, mutants=mutants, device=self.device)
        if self.permute:
            permute_free_lists(engine, seed)
        return EngineSubject(engine)

    def switches(self) -> dict[str, bool]:
        probe = Engine(CONFIGS["offload_contend"], device=self.device)
        return {**{m: True for m in MUTANTS}, STREAM_SWITCH: probe.stream_switch_applicable}
