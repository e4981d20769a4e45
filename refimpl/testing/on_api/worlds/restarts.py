"""Restarts on the API (``Config.restarts``, spec/behaviours/restarts.py): a mixin of
``ApiSubject``.

    EnvCrash     as ``ApiActions._EnvCrash`` (every rank's ``Sender.crash`` /
                 ``Receiver.crash``: the process and its pools gone), and the register of
                 what the spec keeps of the dead worker's requests (``rinc``, ``dep``)
    EnvRestart   what the engine author does when their process comes back: new ends
                 over the new (empty) pools with the next incarnation,
                 ``Sender(..., incarnation=k)`` per rank or ``Receiver(...,
                 incarnation=k)`` (in the decode process, across processes), and the
                 live peer is told by the engine's membership: ``peer_restarted(k)``

Every message carries its sender's incarnation (a write its target's: the ``Ready`` it
answers), so ``on_api.wire.SpecTransport`` names it with the spec's ``inc``; a message
of a dead incarnation is refused by name by the end it reaches and changes nothing (the
spec's ``DecodeDiscard`` / ``PrefillDiscard`` of a fenced message, or a write that
fails at the dead registration).

The refinement map's restart fields: ``p_inc``/``d_inc`` the incarnations built here;
``rinc`` the Senders' offer's (the incarnation of the Ready it took), or, while no live
Sender has an offer of the request, the one the spec keeps from before the crash; a
restarted Receiver's ``dep`` is at least the dead one's (the spec keeps decode's fence
across its restart; a new Receiver fences by its incarnation instead, and no manifest
of an epoch at or below the old fence can reach it: a crash drops every message to it).
"""

from __future__ import annotations

from typing import Any

from refimpl.api import Receiver, Sender
from refimpl.api.abstract import sender_part
from refimpl.testing.on_api.actions import ApiActions, ApiRefusal

__all__ = ["RestartActions"]


class RestartActions(ApiActions):
    """``EnvRestart``, and the registers the refinement map reads across a restart."""

    remote: Any
    stage: bool
    tx_kw: dict[str, Any]
    rx_kw: dict[str, Any]
    p_inc: int
    d_inc: int
    kept_rinc: list[int]

    def restart_init(self, n: int) -> None:
        self.p_inc, self.d_inc, self.kept_rinc = 0, 0, [0] * n

    def senders(self, incarnation: int) -> list[Sender]:
        """One Sender per prefill TP rank (a chunk per (rank, block, layer): the spec's
        chunk is one (rank, block)), over the ranks' pools."""
        from refimpl.testing.on_api.subject import MODEL

        kw = {"rank": 0, "blocks_per_chunk": 1, "incarnation": incarnation, **self.tx_kw}
        return [
            Sender(p, self.gp, self.net, MODEL, **{**kw, "rank": r}) for r, p in enumerate(self.pp)
        ]

    def rinc(self, i: int) -> int:
        """The spec's ``rinc``: the live Senders' offer's, else the one kept."""
        rid = self.rid(i)
        if self.p_up and self.tx[0]._offers.get(rid) is not None:  # noqa: SLF001
            return int(sender_part(self.tx, rid, self.c.blocks)["rinc"])
        return self.kept_rinc[i]

    def _EnvCrash(self, i: int, worker: int) -> None:
        if worker == 0 and self.p_up:
            self.kept_rinc = [self.rinc(k) for k in range(self.n)]
        super()._EnvCrash(i, worker)

    def _EnvRestart(self, i: int, worker: int) -> None:
        self._need(self.p_inc + self.d_inc < self.c.restarts, "no restart left")
        if worker == 0 and not self.p_up:
            self.p_inc += 1
            self.tx = self.senders(self.p_inc)  # the pools: empty since the crash
            self.p_up = True
            self.restart_tier()  # a DiskTier over the same folder adopts its files
            if self.d_up:
                self.rx.peer_restarted(self.p_inc)
        elif worker == 1 and not self.d_up:
            self.d_inc += 1
            if self.remote is None:
                from refimpl.testing.on_api.subject import MODEL

                kw = {"stage": self.stage, "incarnation": self.d_inc, **self.rx_kw}
                self.rx = Receiver(self.dp, self.gd, self.net, MODEL, **kw)
            else:  # the decode process builds it, over its pools
                self.rx.restarted(self.d_inc)  # type: ignore[attr-defined]
            self.d_up = True
            if self.p_up:
                for s in self.tx:
                    s.peer_restarted(self.d_inc)
        else:
            raise ApiRefusal("that worker is up")
