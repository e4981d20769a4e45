"""The two ends of a cluster handoff, built from the public API (``refimpl.api``).

A prefill rank process runs the whole prompt (the tiny model computes its projections
unsplit) into the pools of all T ranks (``refimpl.demo.handoff.Worker``), and its
``Sender(..., rank=r)`` is built over rank r's pool alone (``rank_pools``: the same pool
and block table, no copy), so it ships only rank r's heads. A decode worker is one
``Receiver`` over its TP=1 pools. Every check of the KV (the manifest gate, the
reservation, each chunk's checksum, each rank's seal, the commit) is the API's.
"""

from __future__ import annotations

from refimpl.api import KVGeometry, Receiver, Sender
from refimpl.blocks import BlockAllocator
from refimpl.demo.handoff import Worker
from refimpl.engine.data import RankPools
from refimpl.model import TinyDecoder
from refimpl.transport import Transport

LAYOUT = "heads_major"


def rank_pools(rp: RankPools, rank: int) -> RankPools:
    """TP rank ``rank``'s pool of ``rp`` as that rank's own pools (shared, not copied)."""
    g = rp.pools[rank].geometry
    view = RankPools(1, g.kv_heads, g, 1, device="cpu")
    view.pools = [rp.pools[rank]]
    view.alloc = rp.alloc
    return view


def prefill_end(
    model: TinyDecoder, tp: int, rank: int, block_size: int, cap: int, link: Transport
) -> tuple[Worker, Sender]:
    """Prefill rank ``rank`` of ``tp``: the model's pools and this rank's ``Sender``."""
    w = Worker(model, tp=tp, block_size=block_size, layout=LAYOUT, capacity=cap)
    return w, rank_sender(w, rank, link)


def rank_sender(w: Worker, rank: int, link: Transport) -> Sender:
    """A fresh ``Sender`` of TP rank ``rank`` over ``w``'s pools (no offer yet)."""
    return Sender(rank_pools(w.rp, rank), w.geometry, link, w.identity, rank=rank)


def decode_end(
    model: TinyDecoder, block_size: int, cap: int, link: Transport
) -> tuple[Worker, Receiver]:
    """A decode worker (TP=1): its pools and its ``Receiver``."""
    w = Worker(model, tp=1, block_size=block_size, layout=LAYOUT, capacity=cap)
    return w, Receiver(w.rp, w.geometry, link, w.identity)


def held(alloc: BlockAllocator) -> int:
    """Blocks not free (0 once every request is over)."""
    c = alloc.counts()
    return int(c["reserved"] + c["owned"] + c["quarantined"])


def sent_bytes(geometry: KVGeometry, blocks: int) -> int:
    """Payload bytes of ``blocks`` blocks of every rank of ``geometry``."""
    return blocks * geometry.rank_pool_geometry().block_bytes * geometry.tp


__all__ = ["LAYOUT", "decode_end", "held", "prefill_end", "rank_pools", "rank_sender", "sent_bytes"]
