"""The two ends of a cluster handoff, built from the public API (``refimpl.api``).

A prefill rank process runs the whole prompt (the tiny model computes its projections
unsplit) into the pools of all P ranks (``refimpl.demo.handoff.Worker``), and its
``RankSender(..., rank=r)`` is built over rank r's pool alone (``rank_pools``: the same
pool and block table, no copy), so it ships only rank r's heads, each decode rank its
slice of them. A decode rank process (D per decode worker) is one ``RankReceiver`` over
its own pool: it installs only its heads, and the request is ready only once every
decode rank of the worker installed (``refimpl.api.ranks``: RankAgreement). Every check
of the KV (the manifest gate, the reservation, each chunk's checksum, each rank's seal,
the commit) is the API's.

Decoding over a decode worker's TP ranks, each rank a process holding only its heads.

A decode worker of TP D is D processes: rank 0 (the leader: ``d0``) and ranks 1..D-1
(``d0r1``, ...), each a ``RankReceiver`` that installed only its own heads. The leader
runs the model (the tiny model computes its projections unsplit, as prefill does); its
``SplitKV`` is the model's KV store of D ranks: rank 0's heads are in the leader's own
pool, and each other rank's attention is computed by that rank, in its process, over
the heads it installed (``model.attention_heads``, the arithmetic every rank uses): the
leader sends it the layer's new K and V of its heads and its query heads (``attend``),
the rank writes them into its blocks and answers with its heads' attention
(``attended``). No KV block crosses between the ranks; a rank that does not answer
within the timeout is a dead rank (the router restarts the whole decode worker).

Tensors cross as base64 of their raw bytes with a dtype and a shape (no pickle), read
back by ``unpack`` against what the receiver expects.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from refimpl.api import KVGeometry
from refimpl.api.ranks import Epochs, RankReceiver, RankSender
from refimpl.blocks import BlockAllocator
from refimpl.demo.handoff import Worker
from refimpl.model import PagedKV, TinyConfig, TinyDecoder, attention_heads, rank_kv_of
from refimpl.rankpools import RankPools
from refimpl.reshard import KVLayout, ShardedKV
from refimpl.transport import Transport
from spec import shardmap as sm

LAYOUT = "heads_major"
MAX_TENSOR_BYTES = 1 << 24  # an attend's tensor, at most


def rank_pools(rp: RankPools, rank: int) -> RankPools:
    """TP rank ``rank``'s pool of ``rp`` as that rank's own pools (shared, not copied)."""
    g = rp.pools[rank].geometry
    view = RankPools(1, g.kv_heads, g, 1, device="cpu")
    view.pools = [rp.pools[rank]]
    view.alloc = rp.alloc
    return view


def prefill_end(
    model: TinyDecoder, tp: int, rank: int, block_size: int, cap: int, link: Transport,
    *, dst_tp: int, epochs: Epochs, inc: int,
) -> tuple[Worker, RankSender]:  # fmt: skip
    """Prefill rank ``rank`` of ``tp``: the model's pools and this rank's ``RankSender``."""
    w = Worker(model, tp=tp, block_size=block_size, layout=LAYOUT, capacity=cap)
    return w, rank_sender(w, rank, link, dst_tp=dst_tp, epochs=epochs, inc=inc)


def rank_sender(
    w: Worker, rank: int, link: Transport, *, dst_tp: int, epochs: Epochs, inc: int
) -> RankSender:
    """A fresh ``RankSender`` of TP rank ``rank`` over ``w``'s pools (no offer yet): it
    sends each of the ``dst_tp`` decode ranks its slice of this rank's heads."""
    return RankSender(rank_pools(w.rp, rank), w.geometry, link, w.identity, rank=rank,
                      dst_tp=dst_tp, epochs=epochs, incarnation=inc)  # fmt: skip


def decode_end(
    model: TinyDecoder, block_size: int, cap: int, link: Transport,
    *, tp: int, rank: int, src_tp: int, inc: int,
) -> tuple[Worker, RankReceiver, RankPools]:  # fmt: skip
    """Decode rank ``rank`` of a decode worker of TP ``tp``: the model's pools (this
    rank's alone is used: ``rank_pools``), its ``RankReceiver`` and that pool."""
    w = Worker(model, tp=tp, block_size=block_size, layout=LAYOUT, capacity=cap)
    own = rank_pools(w.rp, rank)
    rx = RankReceiver(own, w.geometry, link, w.identity, rank=rank, src_tp=src_tp,
                      incarnation=inc)  # fmt: skip
    return w, rx, own


def channel_proc(ranks: Callable[[str], int], prefill_tp: int, worker: str, channel: str) -> str:
    """An API channel's process: ``ranks`` (``rank_route``) gives its rank, prefill rank
    r (``p{r}``) or decode rank j of decode worker ``worker`` (``d0``, ``d0r{j}``);
    ValueError for a channel of no rank group."""
    i = ranks(channel)
    return f"p{i}" if i < prefill_tp else worker + (f"r{i - prefill_tp}" if i > prefill_tp else "")


def held(alloc: BlockAllocator) -> int:
    """Blocks not free (0 once every request is over)."""
    c = alloc.counts()
    return int(c["reserved"] + c["owned"] + c["quarantined"])


def room(alloc: BlockAllocator, tokens: int, block_size: int) -> bool:
    """Room for an attempt of ``tokens`` (its prompt and its decode steps), or never enough.
    A decode without room leaves the handoff waiting, as the engines' do (EVENTLOG.md),
    instead of a Nack no request's log can explain (issue #34: its one-request config's
    pool always has room for it)."""
    need = sm.blocks_needed(tokens, block_size)
    return alloc.num_free >= need or need > alloc.capacity


def sent_bytes(geometry: KVGeometry, blocks: int) -> int:
    """Payload bytes of ``blocks`` blocks of every rank of ``geometry``."""
    return blocks * geometry.rank_pool_geometry().block_bytes * geometry.tp


class RankDead(RuntimeError):
    """A decode rank did not answer an ``attend`` in time (its process is gone)."""


def rank_kv(cfg: TinyConfig, layout: str, block_size: int, tp: int, pool: torch.Tensor,
            table: Sequence[int], num_tokens: int) -> PagedKV:  # fmt: skip
    """One decode rank's KV of a request: its heads (``tp_heads``) in its own pool."""
    heads = len(sm.tp_heads(cfg.kv_heads, tp, 0))
    decl = KVLayout(layout, cfg.layers, heads, block_size, cfg.head_dim)
    return PagedKV(ShardedKV(decl, [[pool]], [list(table)], num_tokens))


def pack(t: torch.Tensor) -> dict[str, Any]:
    c = t.detach().contiguous()
    raw = c.view(torch.uint8).reshape(-1).numpy().tobytes() if c.numel() else b""
    return {"shape": list(c.shape), "b64": base64.b64encode(raw).decode("ascii")}


def unpack(d: object, dtype: torch.dtype, ndim: int) -> torch.Tensor:
    """A tensor from ``pack``'s form; ValueError naming what is wrong."""
    if not isinstance(d, dict) or not isinstance(d.get("b64"), str):
        raise ValueError("tensor: not an object with a string 'b64'")
    shape = d.get("shape")
    if not (isinstance(shape, list) and len(shape) == ndim
            and all(type(n) is int and 0 <= n < 1 << 20 for n in shape)):  # fmt: skip
        raise ValueError(f"tensor: shape {shape!r:.60} is not {ndim} ints")
    want = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if want > MAX_TENSOR_BYTES or len(d["b64"]) > 2 * MAX_TENSOR_BYTES:
        raise ValueError(f"tensor: {want} bytes, above {MAX_TENSOR_BYTES}")
    raw = base64.b64decode(d["b64"], validate=True)
    if len(raw) != want:
        raise ValueError(f"tensor: {len(raw)} bytes for shape {shape} ({want} expected)")
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()


class SplitKV:
    """The leader's KV store of a request over D decode ranks (``model.KVStore``)."""

    def __init__(self, cfg: TinyConfig, own: PagedKV, tp: int, call: Callable[..., torch.Tensor]):
        self.cfg, self.own, self._tp, self.call = cfg, own, tp, call
        self.new: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def tp(self) -> int:
        return self._tp

    def heads(self, rank: int) -> range:
        return sm.tp_heads(self.cfg.kv_heads, self._tp, rank)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        h = self.heads(0)
        self.own.write(layer, start, k[h.start : h.stop], v[h.start : h.stop])
        for r in range(1, self._tp):  # the other ranks write theirs at ``attend``
            h = self.heads(r)
            self.new[(layer, r)] = (k[h.start : h.stop], v[h.start : h.stop])

    def read(self, layer: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        if rank != 0:
            raise ValueError(f"decode rank {rank}'s KV is in its own process (attend)")
        return self.own.read(layer, 0)

    def attend(self, layer: int, start: int, rank: int, q: torch.Tensor) -> torch.Tensor | None:
        if rank == 0:
            return None  # the leader's own heads: the model reads them here
        k, v = self.new.pop((layer, rank))
        return self.call(rank, layer, start, q, k, v)


def serve_attend(cfg: TinyConfig, store: PagedKV, tp: int, rank: int,
                 m: dict[str, Any]) -> torch.Tensor:  # fmt: skip
    """A decode rank's side of ``attend``: write the new K/V of its heads, then its
    heads' attention over every position so far (the mask the model uses)."""
    dt = cfg.torch_dtype
    q, k, v = (unpack(m.get(x), dt, 3) for x in ("q", "k", "v"))
    layer, start = m.get("layer"), m.get("start")
    if type(layer) is not int or not 0 <= layer < cfg.layers or type(start) is not int:
        raise ValueError(f"attend: layer {layer!r:.20} / start {start!r:.20} out of range")
    if not 0 <= store.kv.num_tokens - start <= 1:  # the next position (its layer 0 wrote it)
        raise ValueError(f"attend: start {start} is not the next position {store.kv.num_tokens}")
    store.write(layer, start, k, v)
    n = q.shape[1]
    mask = torch.full((n, start + n), -math.inf, dtype=q.dtype).triu(start + 1)
    kk, vv = store.read(layer, 0)
    return attention_heads(q, kk, vv, mask, rank_kv_of(cfg, tp, rank))


def await_reply(poll: Callable[[], list[dict[str, Any]]], keep: Callable[[dict[str, Any]], None],
                seq: int, timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """The ``attended`` answer numbered ``seq``; every other message of each poll goes
    to ``keep``, those behind the answer too (a poll takes them out of the mailbox)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = None
        for m in poll():
            if got is None and m.get("kind") == "attended" and m.get("seq") == seq:
                got = m
            else:
                keep(m)
        if got is not None:
            return got
        time.sleep(0.0005)
    raise RankDead(f"no answer to attend #{seq} in {timeout_s}s")


__all__ = [
    "LAYOUT",
    "channel_proc",
    "RankDead",
    "SplitKV",
    "await_reply",
    "decode_end",
    "held",
    "pack",
    "prefill_end",
    "rank_kv",
    "rank_pools",
    "rank_sender",
    "sent_bytes",
    "serve_attend",
    "unpack",
]
