"""The streamed worlds (``Config.layers``, ``spec/stream/layers.py``) on the API: a mixin
of ``ApiSubject``.

    PrefillFreeze       every rank's ``offer(..., layers=L)``, no layer sent yet
    PrefillSendLayer    every rank's ``send_layer(rid, layer)`` (a copy at that point)
    PrefillFreeSource   the scheduler gives the blocks back, and another request reuses
                        them at once (their bytes overwritten): what a real pool does
    DecodeInstallLayer  the Receiver's own (eager, ``on_api.tour.EAGER``): it installs a
                        layer once every block of it landed
    DecodeLayerReady    the engine asks ``Receiver.layer_ready(rid, layer)``

The refinement map's layer fields: ``lay`` the scheduler's ``send_layer`` calls, ``cpy``
the layers the Senders copied (``Stream.copied``), ``fs`` the scheduler's free, ``inl``
the layers in the blocks ``held()`` names (all once committed), ``rdy`` the layers the
engine was told are ready. A freed source's replica is the Senders' copies: their
chunks' checksums (what the seals list), equal to those of the attempt's content, stand
for it.
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.api import Receiver, Sender
from refimpl.checksum import byte_view, hasher
from refimpl.engine.data import RankPools
from refimpl.testing.ghost import Ghost
from refimpl.testing.on_api.views import view
from spec.config import Config
from spec.state import FAILED, G_END_FAILED, RUNNING

__all__ = ["StreamedActions", "copies_match"]


class StreamedActions:
    """The layer actions; ``rid``, ``_need`` and ``_live`` are ``ApiActions``'s."""

    c: Config
    rid: Any
    _need: Any
    _live: Any
    tx: list[Sender]
    pp: list[RankPools]
    rx: Receiver
    model: Ghost
    st: list[int]
    g: list[int]
    frozen: list[dict[int, int]]
    ep: list[int]
    p_up: bool
    d_up: bool

    def stream_init(self, n: int) -> None:
        self.lay, self.fs, self.rdy = [0] * n, [False] * n, [0] * n

    def _stream(self, s: Sender, i: int) -> Any:
        o = s._offers.get(self.rid(i))  # noqa: SLF001 - the refinement map reads the end
        return None if o is None else o.stream

    def _PrefillSendLayer(self, i: int, arg: int) -> None:
        self._need(bool(self.c.layers) and self.p_up and self._live(i), "no streamed attempt")
        self._need(self.lay[i] < self.c.layers, "every layer given")
        for s in self.layer_senders():
            s.send_layer(self.rid(i), self.lay[i])
        self.lay[i] += 1

    def layer_senders(self) -> list[Any]:
        """The ends whose ``send_layer`` PrefillSendLayer calls: one Sender per prefill
        rank (``RankStream``: one RankSender per prefill rank)."""
        return list(self.tx)

    def _PrefillFreeSource(self, i: int, arg: int) -> None:
        ok = bool(self.c.layers) and self.p_up and self._live(i) and not self.fs[i]
        self._need(ok and self.lay[i] == self.c.layers, "not freeable")
        rid = self.rid(i)
        for p in self.pp:
            blocks = p.alloc.blocks_of(rid)
            p.alloc.free(rid)
            for pool in p.pools:  # reused at once: another request's KV lands there
                for b in blocks:
                    pool.kv[b].fill_(-1.0)
        self.fs[i] = True

    def after_reply(self, i: int, name: str) -> None:
        """A Nack to an offer whose source the scheduler gave back: nothing to resume
        from, so the scheduler fails the request (its KV must be computed again)."""
        if name == "PrefillResume" and self.fs[i] and self.st[i] == RUNNING:
            self.st[i], self.g[i] = FAILED, self.g[i] | G_END_FAILED

    def _DecodeInstallLayer(self, i: int, arg: int) -> None:
        self._need(False, "the Receiver installs a layer itself once it landed (eager)")

    def _DecodeLayerReady(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        held = self.d_up and view(self.rx, "attempt_held", rid)
        self._need(bool(self.c.layers) and bool(held) and self.rdy[i] < self.c.layers, "none")
        self._need(self.rx.layer_ready(rid, self.rdy[i]), "the layer is not ready")
        self.rdy[i] += 1

    def stream_fields(self, i: int) -> dict[str, int]:
        """lay, cpy, fs, inl, rdy of request i (all 0 in a world without layers)."""
        if not self.c.layers:
            return {}
        return {
            "lay": self.lay[i],
            "cpy": self._copied(i),
            "fs": int(self.fs[i]),
            "inl": self._installed(i),
            "rdy": self.rdy[i],
        }

    def _copied(self, i: int) -> int:
        """Layers the source copied (``Stream.copied``), 0 while prefill is down."""
        st = self._stream(self.tx[0], i) if self.p_up else None
        return int(st.copied) if st is not None else 0

    def _installed(self, i: int) -> int:
        if not self.d_up:
            return 0
        return int(view(self.rx, "installed_layers", self.rid(i), self.c.layers))

    def copies_replica(self, i: int) -> torch.Tensor | None:
        """A freed source's replica: the content whose checksums the Senders' copies have."""
        want = self.model.content(i, self.frozen[i].get(self.ep[i], 0))
        h = want.shape[3] // len(self.tx)
        for r, s in enumerate(self.tx):
            if not copies_match(self._stream(s, i), r, want, r * h, (r + 1) * h):
                return None
        return want


def copies_match(st: Any, r: int, want: torch.Tensor, lo: int, hi: int) -> bool:
    """Has stream ``st`` copied every layer, and do its rank ``r``'s chunks (what its
    seal lists) hash as heads ``lo:hi`` of ``want`` (every block and layer, in order)?"""
    if st is None or st.copied < st.layers:
        return False
    sums = st.sums.get(r, [])
    if sum(k for _, _, k, _ in sums) != want.shape[0] * want.shape[1]:
        return False  # not every (block, layer) of this rank was copied
    for layer, j, k, checksum in sums:  # each chunk: its blocks' layer, in order
        d = hasher()
        for b in range(j, j + k):
            d.update(byte_view(want[b, layer, :, lo:hi].contiguous()))
        if d.hexdigest() != checksum:
            return False
    return True
