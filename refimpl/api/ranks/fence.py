"""``PieceIncarnations``: a decode rank's sub-handoff fence, one incarnation per prefill
rank it hears.

A decode rank's sub-handoff (``ranks.sub_id``) hears every prefill rank that holds some
of its heads (its pieces, ``group._pieces``), each ``RankSender``'s sub-handoff
``Sender`` stamping its own rank's incarnation. One peer incarnation for all of them (a
``Receiver``'s ``wire.Incarnations``) would take a restarted prefill rank's newer
incarnation as every piece's and refuse a sibling that did not restart. Here a control
message (a manifest: piece 0's, the leader's; a seal or an abort: its ``rank``, the
piece's index) is stale when it is older than the newest incarnation known of that
piece's prefill rank (told by ``RankReceiver.peer_restarted`` or heard on a message); a
write (chunk) is checked against this decode rank's own incarnation, as
``Incarnations`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from refimpl.api.wire import CHUNK, Incarnations, check_incarnation

__all__ = ["PieceIncarnations"]


class PieceIncarnations(Incarnations):
    """``Incarnations`` with one peer incarnation per prefill rank (see the module doc)."""

    def __init__(
        self, own: int, who: str, src_ranks: Sequence[int], accept_stale: bool = False
    ) -> None:
        """``src_ranks``: the prefill rank of each piece, in the pieces' order."""
        super().__init__(own, who, accept_stale)
        self.src_ranks = list(src_ranks)
        self.newest: dict[int, int] = {}  # prefill rank -> its newest incarnation known

    def restarted_rank(self, src_rank: int, inc: int) -> None:
        """Prefill rank ``src_rank`` came back as ``inc`` (never goes back); a rank this
        decode rank hears nothing from is not recorded."""
        inc = check_incarnation(inc, f"{self.who}.peer_restarted")
        if src_rank in self.src_ranks:
            self.newest[src_rank] = max(self.newest.get(src_rank, 0), inc)

    def stale(self, rid: str, header: Mapping[str, Any]) -> bool:
        if header.get("type") == CHUNK:
            return super().stale(rid, header)  # a write: this rank's own registration
        piece = header.get("rank", 0)
        ok = type(piece) is int and 0 <= piece < len(self.src_ranks)
        src = self.src_ranks[piece] if ok else -1  # a rank no piece names: every rank's newest
        self.peer = self.newest.get(src, 0) if ok else max(self.newest.values(), default=0)
        refused = super().stale(rid, header)  # may learn a newer incarnation (self.peer)
        if ok:
            self.newest[src] = max(self.newest.get(src, 0), self.peer)
        return refused
