"""Engines with one planted bug each, for the tests of the machine's checks: one per
class of survivor the first machine missed (issue #18). Each is a one-edit change of the
reference engine, written as a subclass so that the tests need no source edits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refimpl.engine import Engine
from refimpl.engine.base import RX_COMMITTED, NotEnabled
from refimpl.testing.adapter import EngineAdapter, EngineSubject, permute_free_lists
from spec.config import Config
from spec.state import RUNNING


@dataclass
class PlantedAdapter(EngineAdapter):
    """The reference engine's adapter, building ``engine`` (a buggy subclass)."""

    engine: type[Engine] = Engine

    def build(self, config: Config, mutants: frozenset[str], seed: int) -> EngineSubject:
        e = self.engine(config, seed=seed, mutants=mutants, device=self.device)
        if self.permute:
            permute_free_lists(e, seed)
        return EngineSubject(e)


class RecomputeLosesTokens(Engine):
    """Recompute rebuilds the prompt only: the generated tokens' KV is lost. The engine
    writes its own truth the same way, so its ``damaged()`` sees nothing."""

    def _compute_kv(self, i: int) -> torch.Tensor:
        return torch.stack([self._block_kv(i, j) for j in range(self.n)])


class LeaksOnQuiesce(Engine):
    """Quiescing an ended request leaves one prefill block behind, under a holder the
    refinement map does not look at: only a drain to quiescence shows it."""

    def PrefillQuiesce(self, req: int) -> None:
        super().PrefillQuiesce(req)
        if self.P.alloc.can_allocate(1):
            self.P.alloc.allocate(f"r{req}@scratch", 1)


class FindIgnoresIndex(Engine):
    """A receiver matching a message by kind and epoch only: a forged index is accepted
    as the message in flight."""

    def find(self, i: int, msg: str, epoch: int, idx: int) -> tuple[str, int]:
        try:
            return super().find(i, msg, epoch, idx)
        except NotEnabled:
            return super().find(i, msg, epoch, 0)


class DecodeStepWrongOrder(Engine):
    """Decode appends a token through the table (own blocks, then prefix blocks): the
    wrong block, but only when the prefix hit is partial (0 < prefix < blocks)."""

    def DecodeStep(self, req: int) -> None:
        i, x = req, self.rx[req]
        if not self.d_up or x.phase != RX_COMMITTED or self.req[i].status != RUNNING:
            return super().DecodeStep(req)
        logical = x.own + self.D.alloc.blocks_of(self.rid(i) + "#pfx")
        self._append_token(i, self.D, logical, self.rid(i))


class CrashKeepsPrefix(Engine):
    """A decode crash keeps the prefix cache's records (its memory is gone): needs a
    crash and a prefix cache in one world."""

    def _crash_decode(self) -> None:
        blocks, chain = self.prefix_blocks, self.prefix_chain
        super()._crash_decode()
        if blocks:
            self.prefix_blocks = tuple(self.D.alloc.allocate("prefix-cache", len(blocks)))
            self.prefix_chain = chain
