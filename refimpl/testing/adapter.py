"""The torch reference engine as a ``testing.harness.Adapter``: what the Hypothesis
machine (``refimpl.testing.machine``) drives by default."""

from __future__ import annotations

import random
from dataclasses import dataclass

from refimpl.engine import STREAM_SWITCH, Engine
from refimpl.errors import OwnershipError
from spec.config import CONFIGS, Config
from spec.mutants import MUTANTS

__all__ = ["EngineAdapter", "EngineSubject"]


class EngineSubject:
    """``refimpl.engine.Engine`` seen through the ``Subject`` protocol."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.step = engine.step
        self.abstract = engine.abstract
        self.check_integrity = engine.check_integrity
        self.data_problems = engine.damaged  # byte equality with the ground truth
        self.snapshot = engine.fingerprint  # allocators, pool bytes, wire, records


@dataclass
class EngineAdapter:
    """The torch reference engine (tiny tensors: block size 2, head dim 4, two layers)."""

    device: str | None = None  # None: the engine's default (CUDA when present)
    name: str = "refimpl.engine"
    refusals: tuple[type[BaseException], ...] = (OwnershipError,)
    randoms: tuple[random.Random, ...] = ()  # the engine seeds torch generators only

    def build(self, config: Config, mutants: frozenset[str], seed: int) -> EngineSubject:
        return EngineSubject(Engine(config, seed=seed, mutants=mutants, device=self.device))

    def switches(self) -> dict[str, bool]:
        probe = Engine(CONFIGS["offload_contend"], device=self.device)
        return {**{m: True for m in MUTANTS}, STREAM_SWITCH: probe.stream_switch_applicable}
