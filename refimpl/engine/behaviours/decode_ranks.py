"""Decode TP ranks (spec ``spec/behaviours/decode_ranks.py``): each decode rank installs
its own shard of a validated replica, and decode commits only when every rank has.

A rank's install maps the request's blocks (the shared prefix, then its own) into that
rank's block table (``tables``), which is what that rank's attention reads: a rank that
has not installed reads no KV of the request at all.
"""

from __future__ import annotations

from refimpl.engine.base import RX_COMMITTED, RX_VALIDATED, RankError
from refimpl.engine.env import EnvActions
from refimpl.errors import CancelledError
from spec.state import RUNNING

__all__ = ["DecodeRankActions"]


class DecodeRankActions(EnvActions):
    def _ranks(self) -> dict[int, int]:
        """request -> the decode ranks that installed (created on first use)."""
        got: dict[int, int] = self.__dict__.setdefault("_dmask", {})
        return got

    def tables(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """(request, decode rank) -> the block table that rank's attention reads."""
        got: dict[tuple[int, int], tuple[int, ...]] = self.__dict__.setdefault("_tables", {})
        return got

    def dmask_of(self, i: int) -> int:
        """Spec ``dmask``: the decode ranks that installed request i's validated replica."""
        if self.rx[i].phase not in (RX_VALIDATED, RX_COMMITTED):
            return 0
        return self._ranks().get(i, 0)

    def _all_dst(self) -> int:
        c = self.config
        return (1 << c.dst_tp) - 1 if c.decode_ranks else 0

    def DecodeRankInstall(self, req: int) -> None:
        """The lowest decode rank not yet installed checks and maps its shard."""
        i, x = req, self.rx[req]
        mask, full = self.dmask_of(i), self._all_dst()
        if not self.config.decode_ranks or not self.d_up or x.phase != RX_VALIDATED:
            raise self._ne("DecodeRankInstall", i)
        if mask == full:
            raise self._ne("DecodeRankInstall", i)
        if self.req[i].status != RUNNING:
            raise CancelledError(f"r{i} has ended; no rank installs after that")
        k = (mask + 1 & ~mask).bit_length() - 1  # the lowest rank not in
        logical = self.D.alloc.blocks_of(self.rid(i) + "#pfx") + x.own
        self.tables()[(i, k)] = tuple(logical)
        self._ranks()[i] = mask | 1 << k

    def DecodeCommit(self, req: int) -> None:
        """The commit point needs every decode rank's install (the
        ``decode_runs_before_all_ranks`` bug takes the first rank's word for all)."""
        i, x = req, self.rx[req]
        if self.d_up and x.phase == RX_VALIDATED and self.config.decode_ranks:
            mask, full = self.dmask_of(i), self._all_dst()
            ok = mask != 0 if "decode_runs_before_all_ranks" in self.m else mask == full
            if not ok:
                raise RankError(f"decode ranks {mask:b} installed of {full:b}")
        super().DecodeCommit(req)

    def _forget_rx(self, i: int) -> None:
        super()._forget_rx(i)
        self._ranks().pop(i, None)
        for k in range(self.config.dst_tp):
            self.tables().pop((i, k), None)
