"""Decode ranks streamed layer by layer (``Config.decode_ranks`` with ``Config.layers``):
the layer actions and registers of ``RankSubject`` (``worlds/ranks.py``), a mixin over
``StreamedActions`` (``worlds/streamed.py``, the one-Receiver world's).

    PrefillSendLayer    every prefill rank's ``RankSender.send_layer(rid, layer)``: each
                        sub-handoff's Sender copies its decode rank's slice of the layer
                        at once
    PrefillFreeSource   as the one-Receiver world's (every prefill rank's blocks freed and
                        overwritten at once)
    DecodeLayerReady    the engine asks every decode rank (``RankReceiver.layer_ready``):
                        the spec's decode is one worker of ``dst_tp`` ranks, so a layer is
                        ready only once every rank has its heads of it in the blocks that
                        rank's engine reads

The refinement map's layer fields: ``cpy`` the layers every sub-handoff's Sender copied
(the fewest: ``Stream.copied``; the spec's copy is of the whole layer), ``inl`` the
layers every decode rank has in its blocks (the fewest), ``rdy`` the layers the engine
was told are ready on every rank. A freed source's replica is the sub-Senders' copies:
each one's chunk checksums, equal to those of its decode rank's heads of the attempt's
content, stand for it (``streamed.copies_match``).
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.api.ranks import sub_id
from refimpl.testing.on_api.views import view
from refimpl.testing.on_api.worlds.streamed import StreamedActions, copies_match

__all__ = ["RankStream"]


class RankStream(StreamedActions):
    """The layer actions on the rank ends (``RankSubject``'s ``ptx``, ``rxs``)."""

    ptx: list[Any]
    rxs: list[Any]
    gp: Any  # the prefill side's KVGeometry (RankSubject)

    def sub_streams(self, i: int) -> list[tuple[int, int, Any, Any]]:
        """(prefill rank, decode rank, sub-handoff Sender, its Stream or None) of every
        sub-handoff of request ``i``."""
        rid = self.rid(i)
        out = []
        for r, s in enumerate(self.ptx):
            for d, (tx, _, _) in s._subs.items():  # noqa: SLF001 - the map reads the end
                o = tx._offers.get(sub_id(rid, d))  # noqa: SLF001
                out.append((r, d, tx, None if o is None else o.stream))
        return out

    def layer_senders(self) -> list[Any]:
        return list(self.ptx)

    def _DecodeLayerReady(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        held = self.d_up and all(
            view(r.rx, "attempt_held", sub_id(rid, d)) for d, r in enumerate(self.rxs)
        )
        self._need(bool(self.c.layers) and held and self.rdy[i] < self.c.layers, "none")
        not_yet = [r.rank for r in self.rxs if not r.layer_ready(rid, self.rdy[i])]
        self._need(not not_yet, f"layer {self.rdy[i]} is not ready on decode ranks {not_yet}")
        self.rdy[i] += 1

    def _copied(self, i: int) -> int:
        """The fewest layers any sub-handoff's Sender copied (0 until every one has a
        stream)."""
        streams = [st for *_, st in self.sub_streams(i)] if self.p_up else []
        copied = [st.copied for st in streams if st is not None]
        return min(copied) if copied and len(copied) == len(streams) else 0

    def _installed(self, i: int) -> int:
        if not self.d_up:
            return 0
        rid, layers = self.rid(i), self.c.layers
        return min(
            int(view(r.rx, "installed_layers", sub_id(rid, d), layers))
            for d, r in enumerate(self.rxs)
        )

    def copies_replica(self, i: int) -> torch.Tensor | None:
        """A freed source's replica: the content whose heads each sub-Sender's copies
        hash as (its decode rank's piece of its prefill rank's heads)."""
        want = self.model.content(i, self.frozen[i].get(self.ep[i], 0))
        own = self.gp.kv_heads_per_rank
        subs = self.sub_streams(i)
        if not subs:
            return None
        for r, d, tx, st in subs:
            piece = self.pieces_of(d)[tx.rank]
            lo, hi = r * own + piece.src_start, r * own + piece.src_stop
            if not copies_match(st, tx.rank, want, lo, hi):
                return None
        return want

    def pieces_of(self, d: int) -> list[Any]:
        from refimpl.api.ranks.group import _pieces

        return _pieces(self.gp.kv_heads, self.c.src_tp, self.c.dst_tp, d)
