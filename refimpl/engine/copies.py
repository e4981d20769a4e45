"""The prefill worker's data moves, shared by its actions: its block table (the ids
pruned out of the window first), a decoded token's KV written into the writable replica
(the ground truth copied on write when a snapshot shares it), and the offload/reload
copy of whole blocks over every TP rank (on CUDA on the transfer stream; the
``reload_on_critical_stream`` switch puts it on the compute stream)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refimpl.engine.data import RankPools
from refimpl.engine.restarts import RestartBase
from refimpl.pool import copy_blocks

__all__ = ["CopyBase"]


class CopyBase(RestartBase):
    def p_table(self, i: int) -> tuple[int, ...]:
        """Request i's prefill block table, logical order: the ids pruned out of its window
        (freed: only a reader set up before the prune still reads them, the
        ``window_prunes_under_io`` bug's store), then the blocks it holds."""
        return tuple(self.req[i].window) + self.P.alloc.blocks_of(self.rid(i))

    def _append_token(self, i: int, pools: RankPools, logical: Sequence[int], holder: str) -> None:
        """Decode one token: write its KV into slot (j, s) of the writable replica."""
        r = self.req[i]
        where = self._next_slot(i)
        if where is not None:
            j, s = where
            tok = self._token_kv(i, r.steps)
            pools.write_token(holder, logical[j], s, tok)  # asks the allocator first
            truth = self.truth[i]
            assert truth is not None
            if truth is self.frozen_truth[i]:  # copy on write: the snapshot keeps its version
                truth = self.truth[i] = truth.clone()
            truth[j, :, :, :, s] = tok
            r.slots[(j, s)] = r.steps
        r.steps += 1

    def _copy(
        self,
        src: RankPools,
        s_ids: list[int],
        dst: RankPools,
        d_ids: list[int],
        i: int,
        holder: str | None = None,
    ) -> None:
        """Offload/reload copy of whole blocks, every TP rank; on CUDA on the transfer stream
        (the ``reload_on_critical_stream`` switch puts it on the compute stream instead).
        ``holder``: the destination's writer, when not the request (a shared host copy)."""
        critical = "reload_on_critical_stream" in self.mutants and dst.device.type == "cuda"
        writer = holder or self.rid(i)
        if critical:
            dst.alloc.check_write(writer, d_ids)
        for r in range(src.tp):
            if not critical:
                copy_blocks(src.pools[r], s_ids, dst.pools[r], d_ids, writer)
                continue
            for s, d in zip(s_ids, d_ids, strict=True):  # on the compute stream: blocks decode
                dst.pools[r].kv[d].copy_(src.pools[r].kv[s], non_blocking=True)
        if critical:
            torch.cuda.synchronize()
