"""The refinement map of the decode-rank worlds (``RankSubject``, ``worlds/ranks.py``):
the spec's state of a request read from every rank's end.

Prefill TP > 1: a sub-handoff's chunk or seal names its piece's index as its rank; the
transport names it with the piece's prefill rank (``prefill_rank``), so prefill rank r's
chunk (r, b) is one spec message whatever decode ranks it reaches. A decode rank commits
its part once its own pieces landed, maybe before another prefill rank's chunks to
another decode rank: its ack waits in the transport until every decode rank replied (or
one nacked: ``SpecTransport._verdict``), the decode worker's one verdict.

The prefill part is the sub-handoffs' Senders' (``sender_part`` of each decode rank's,
all equal, else ``RankDisagreement``; ``sent`` every prefill rank's chunks and seal once
all are sealed); the decode part is every rank's ``receiver_part``: ``d`` and ``dep``
the same on every rank (else ``RankDisagreement``; RESERVED and FILLING are one,
FILLING once any chunk landed), a chunk (r, b) landed once every decode rank prefill
rank r sends to has its copy, a seal likewise (``spec_bits``), the ended attempt's error
any rank's; a rank whose sub-handoff committed while the request is not ready is
COMPLETE with its bit in ``dmask`` once every rank's part committed (validated), else
FILLING with its chunks landed (its install is not yet the spec's, which follows the
whole replica's validation); every rank ready is WRITABLE with ``dmask`` full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from refimpl.api.abstract import RankDisagreement, receiver_part, sender_part
from refimpl.api.ranks import sub_id
from refimpl.api.ranks.group import _pieces
from spec.behaviours.decode_ranks import all_dst_ranks
from spec.state import COMPLETE, FILLING, RESERVED, WRITABLE

__all__ = ["RankMap"]


class RankMap:
    """The spec's part of each side, read from the rank ends (a ``RankSubject`` mixin)."""

    c: Any
    gp: Any
    p_up: bool
    d_up: bool
    dead_dep: list[int]
    kept_rinc: list[int]
    ptx: list[Any]
    rxs: list[Any]
    rid: Callable[[int], str]  # the subject's (``on_api.actions``)

    def pieces(self, d: int) -> list[int]:
        """The prefill rank of each piece of decode rank ``d``'s heads (its sub-handoff's
        ranks, in order)."""
        c = self.c
        return [p.src_rank for p in _pieces(self.gp.kv_heads, c.src_tp, c.dst_tp, d)]

    def prefill_rank(self, channel: str, rank: int) -> int:
        """The spec's prefill rank of a sub-handoff's chunk or seal: its piece's."""
        d = int(channel.rpartition(">")[0].rpartition("@")[2])
        return self.pieces(d)[rank]

    def sender_view(self, i: int) -> dict[str, int]:
        if not self.p_up:
            return {"ps": 0, "sent": 0, "live": 0}
        rid, views = self.rid(i), []
        for d in range(self.c.dst_tp):
            subs = [s._subs[d][0] for s in self.ptx if d in s._subs]  # noqa: SLF001
            views.append(sender_part(subs, sub_id(rid, d), self.c.blocks))
        if any(v != views[0] for v in views):
            raise RankDisagreement(f"{rid!r}: the sub-handoffs' senders differ: {views}")
        out = dict(views[0])
        if out["sent"]:  # every sub-handoff sealed: every prefill rank sent all it had
            out["sent"] = self.c.src_tp * (self.c.blocks + 1)
        return out

    def rinc(self, i: int) -> int:
        """The spec's ``rinc``: the live sub-handoffs' offer's (the incarnation of the
        Ready it took), else the one kept from before prefill's crash
        (``RestartActions.kept_rinc``)."""
        rid = self.rid(i)
        subs = [s._subs[d][0] for s in self.ptx for d in s._subs] if self.p_up else []  # noqa: SLF001
        if any(sub_id(rid, d) in t._offers for t in subs for d in range(self.c.dst_tp)):  # noqa: SLF001
            return int(self.sender_view(i).get("rinc", 0))
        return self.kept_rinc[i]

    def receiver_view(self, i: int) -> dict[str, int]:
        if not self.d_up:  # every decode rank's process is gone: the spec keeps dep
            return {"d": 0, "dep": self.dead_dep[i], "landed": 0, "rmask": 0, "dfl": 0}
        rid, m = self.rid(i), self.c.blocks
        parts = [receiver_part(r.rx, sub_id(rid, d), m) for d, r in enumerate(self.rxs)]
        validated = all(p["d"] == WRITABLE for p in parts)  # every rank's part committed
        for d, (r, rp) in enumerate(zip(self.rxs, parts, strict=True)):
            rp["dmask"] = 0
            if rp["d"] == WRITABLE and not r.ready(rid):  # installed, not yet committed
                # before every rank's part landed (prefill TP > 1: another prefill rank's
                # chunks are still out), a rank's install is its chunks and seals landed
                rp["d"], rp["dmask"] = (COMPLETE, 1 << d) if validated else (FILLING, 0)
        landed, rmask = self.spec_bits(parts)
        if {p["d"] for p in parts} <= {RESERVED, FILLING}:  # chunks land rank by rank
            for p in parts:
                p["d"] = FILLING if landed else RESERVED
        for k in ("d", "dep"):
            if len({p[k] for p in parts}) > 1:
                raise RankDisagreement(f"{rid!r}: the decode ranks' {k} differ: {parts}")
        out = dict(parts[0], landed=landed, rmask=rmask)
        out["dep"] = max(out["dep"], self.dead_dep[i])  # restarted ranks: the spec's fence
        for p in parts[1:]:
            out["dfl"] |= p["dfl"]
            out["dmask"] |= p["dmask"]
        if out["d"] == WRITABLE:
            out["dmask"] = all_dst_ranks(self.c)
        return out

    def spec_bits(self, parts: list[dict[str, int]]) -> tuple[int, int]:
        """(landed, rmask) in the spec's prefill ranks: a chunk (rank, block) landed, a
        seal held, once every decode rank that rank sends to has its copy."""
        m, landed, rmask, cover, rcover = self.c.blocks, -1, -1, 0, 0
        for d, p in enumerate(parts):
            mine, theirs, seals, sealed = 0, 0, 0, 0
            for k, src in enumerate(self.pieces(d)):
                block_bits = (1 << m) - 1
                mine |= block_bits << (src * m)
                theirs |= ((p["landed"] >> (k * m)) & block_bits) << (src * m)
                seals |= 1 << src
                sealed |= ((p["rmask"] >> k) & 1) << src
            landed &= theirs | ~mine
            rmask &= sealed | ~seals
            cover, rcover = cover | mine, rcover | seals
        return landed & cover, rmask & rcover
