"""An engine's own KV caches as kvown's pools: registered once, read and written in place.

    pools = register_kv_caches(geometry, caches, "flash_attn")   # per layer, or one
    pools.adopt("req-1", scheduler_block_ids)                     # cross-layer tensor
    tx = Sender(pools, geometry, transport, model)                # the API, unchanged
    tx.offer("req-1", token_ids, blocks=scheduler_block_ids)
    ...                                                           # once acked:
    pools.freeable("req-1"); pools.release("req-1")               # the engine frees them

    rx = Receiver(pools, geometry, transport, model)
    rx.expect("req-2", blocks=the_blocks_the_scheduler_allocated)
    ...                                                           # committed: the
    pools.freeable("req-2")                                       # request's own blocks

``caches``: per TP rank held here (``ranks=[...]`` for several, as one process of a test
holds them), either one tensor per layer (a sequence, or vLLM's ``{layer_name: tensor}``
in layer order) or one cross-layer tensor, in one of ``refimpl.memory.layouts.LAYOUTS``.
Nothing is copied at registration: every block is reached through views of the engine's
tensors (``RegisteredPool.layer``), so a chunk of the same geometry lands with one copy,
straight into the engine's block; a reshard or another block size stages as before.
Everything about the tensors is checked before anything is registered, and a wrong
shape, dtype, device, layout or geometry is refused naming what is wrong.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from refimpl.checksum import Buffer, byte_view, tensor_from_bytes
from refimpl.memory.engine_blocks import EngineBlocks
from refimpl.memory.interface import BlockMemory
from refimpl.memory.layouts import cross_view, layer_view, layout
from refimpl.memory.views import write_bytes
from refimpl.pool import PoolGeometry, check_block_source
from refimpl.rankpools import RankPools

if TYPE_CHECKING:
    from refimpl.api.geometry import KVGeometry

Caches = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]


class _Staging:
    """Reused buffers for the blocks a snapshot sends (per-layer caches: a block is not
    one range): a fresh buffer costs a page fault per page on first touch, more than the
    copy. A buffer is lent with the views the snapshot's payloads hold, and taken again
    only once every one of them is gone (weak references: nothing is reused under IO)."""

    def __init__(self, geometry: PoolGeometry, device: torch.device, keep: int = 4) -> None:
        self.geometry, self.device, self.keep = geometry, device, keep
        self._lent: list[tuple[torch.Tensor, list[weakref.ref[torch.Tensor]]]] = []

    def take(self, n: int) -> torch.Tensor:
        for k, (buf, views) in enumerate(self._lent):
            if buf.shape[0] == n and all(v() is None for v in views):
                del self._lent[k]
                return buf
        g = self.geometry
        return torch.empty((n, *g.block_shape), dtype=g.dtype, device=self.device)

    def lend(self, buf: torch.Tensor, views: Sequence[torch.Tensor]) -> None:
        self._lent.append((buf, [weakref.ref(v) for v in views]))
        if len(self._lent) > self.keep:  # the oldest is dropped (its views keep it alive)
            del self._lent[0]


class RegisteredPool(BlockMemory):
    """One TP rank's registered caches: per-layer views ``[N, K, a, b, D]`` of the
    engine's tensors, and ``kv`` ``[N, L, K, a, b, D]`` where one tensor holds them all."""

    def __init__(
        self, geometry: PoolGeometry, layers: Sequence[torch.Tensor], kv: torch.Tensor | None
    ) -> None:
        self.geometry, self._layers, self._kv = geometry, list(layers), kv
        self.device = self._layers[0].device
        self._capacity = self._layers[0].shape[0]
        self.allocator = EngineBlocks(self._capacity)  # replaced by the ranks' shared one
        self._staging = _Staging(geometry, self.device)
        self.copy_stream = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.device.type == "cuda"
            else None
        )

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def kv(self) -> torch.Tensor:
        if self._kv is None:
            raise TypeError(
                "registered per-layer caches are separate tensors: there is no one kv "
                "tensor of every layer; read and write through layer(l)"
            )
        return self._kv

    def layer(self, layer: int) -> torch.Tensor:
        return self._layers[layer]

    def clear(self) -> None:
        pass  # the engine's memory: kvown forgets its blocks, never zeroes them

    def _contiguous_block(self) -> bool:
        return self._kv is not None and self._kv[0].is_contiguous()

    def block(self, b: int) -> torch.Tensor:
        if self._kv is not None:
            return self._kv[b]
        return torch.stack([lv[b] for lv in self._layers])

    def read_blocks(
        self, block_ids: Sequence[int], out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One ``copy_`` per block (per block and layer when the layers are separate):
        torch's ``index_select`` of MiB-sized rows runs at a tenth of a copy's speed."""
        g = self.geometry
        if out is None:
            out = torch.empty((len(block_ids), *g.block_shape), dtype=g.dtype, device=self.device)
        for j, b in enumerate(block_ids):
            if self._kv is not None:
                out[j].copy_(self._kv[b])
                continue
            for li, lv in enumerate(self._layers):
                out[j, li].copy_(lv[b])
        return out

    def host_bytes(self, block_ids: Sequence[int]) -> list[memoryview]:
        """Zero-copy where a block is one contiguous range of host memory (a cross-layer
        NHD cache), else one gathered copy of the blocks (staged D2H on CUDA), into a
        buffer reused once no view of its last use is alive (``_Staging``)."""
        if self.device.type == "cpu" and self._contiguous_block():
            return [byte_view(self.kv[b]) for b in block_ids]
        got = self.read_blocks(block_ids, self._staging.take(len(block_ids)))
        if self.copy_stream is not None:
            staged = torch.empty(got.shape, dtype=got.dtype, pin_memory=True)
            staged.copy_(got)
            got = staged
        views = [got[i] for i in range(len(block_ids))]
        self._staging.lend(got, views)
        return [byte_view(v) for v in views]

    def write_raw(self, b: int, payload: Buffer) -> None:
        if self._kv is not None:
            write_bytes(self._kv[b], payload)
            return
        src = memoryview(payload).cast("B")
        per = src.nbytes // len(self._layers)
        for li, lv in enumerate(self._layers):
            write_bytes(lv[b], src[li * per : (li + 1) * per])

    def _write(self, b: int, src: torch.Tensor) -> None:
        if self._kv is not None:
            self._kv[b].copy_(src)
            return
        for li, lv in enumerate(self._layers):
            lv[b].copy_(src[li])

    def write_block(self, holder: str, b: int, src: torch.Tensor) -> None:
        self.allocator.check_write(holder, [b])
        self._write(b, src)

    def write_blocks(self, holder: str, block_ids: Sequence[int], src: torch.Tensor) -> None:
        self.allocator.check_write(holder, block_ids)
        if len(block_ids) != src.shape[0]:
            raise ValueError(f"{len(block_ids)} block ids for {src.shape[0]} source blocks")
        for k, b in enumerate(block_ids):
            self._write(b, src[k].to(self.device))

    def write_block_bytes(
        self, holder: str, b: int, data: Buffer, src_geometry: PoolGeometry | None = None
    ) -> None:
        g, src_g = self.geometry, src_geometry or self.geometry
        check_block_source(g, src_g, len(data))
        self.allocator.check_write(holder, [b])
        if src_g.layout == g.layout:
            self.write_raw(b, data)
            return
        src = tensor_from_bytes(data, g.dtype, src_g.block_shape).transpose(2, 3)
        self._write(b, src)


class RegisteredPools(RankPools):
    """A worker's registered caches, one ``RegisteredPool`` per TP rank held here, and
    their one ``EngineBlocks`` table (the engine's block ids)."""

    alloc: EngineBlocks

    def adopt(self, request_id: str, block_ids: Sequence[int]) -> list[int]:
        """The scheduler's blocks of ``request_id`` hold its KV (written by the engine)."""
        return self.alloc.adopt(request_id, block_ids)

    def freeable(self, request_id: str) -> tuple[int, ...]:
        """The request's engine blocks kvown no longer touches (``EngineBlocks``)."""
        return self.alloc.freeable(request_id)

    def release(self, request_id: str) -> tuple[int, ...]:
        """The engine frees the request's blocks (refused while one is not freeable)."""
        return self.alloc.release(request_id)


def head_slice(pools: RankPools, want: PoolGeometry, lo: int) -> RankPools:
    """Heads ``[lo, lo + want.kv_heads)`` of ``pools``' one rank, as one rank's pools of
    ``want`` (views of its layers: nothing copied, kvown's pool or an engine's caches
    alike) sharing ``pools``' block table (its ids, its holders): what a prefill rank
    sends a narrower decode rank (``refimpl.api.ranks.RankSender``)."""
    if pools.tp != 1:
        raise ValueError(f"head_slice: pools of {pools.tp} ranks; one rank's are sliced")
    src, axis = pools.pools[0], 2 if want.layout == "heads_major" else 3
    if not 0 <= lo <= lo + want.kv_heads <= pools.geometry.kv_heads:
        raise ValueError(
            f"head_slice: heads [{lo}, {lo + want.kv_heads}) of {pools.geometry.kv_heads}"
        )
    views = [src.layer(li).narrow(axis, lo, want.kv_heads) for li in range(want.num_layers)]
    mem = RegisteredPool(want, views, None)
    out = RankPools(1, want.kv_heads, want, mem.capacity, memory=[mem])
    out.alloc = mem.allocator = pools.alloc  # the source's ids and holders, not a copy
    return out


def _layers_of(caches: Caches, what: str) -> list[torch.Tensor]:
    if isinstance(caches, Mapping):
        return list(caches.values())
    if isinstance(caches, Sequence) and not isinstance(caches, str | bytes):
        return list(caches)
    raise ValueError(
        f"{what}: per-layer caches are a sequence or a dict of tensors, got {type(caches).__name__}"
    )


def _rank_pool(
    want: PoolGeometry, caches: Caches, name: str, cross: bool, what: str
) -> RegisteredPool:
    lay = layout(name)
    if lay.kv_layout != want.layout:
        raise ValueError(
            f"{what}: {name} caches hold {lay.kv_layout} blocks, the geometry says "
            f"layout={want.layout!r} (KVGeometry(..., layout={lay.kv_layout!r}))"
        )
    if cross:
        if not isinstance(caches, torch.Tensor):
            raise ValueError(
                f"{what}: a cross-layer cache is one tensor, got {type(caches).__name__}"
            )
        kv: torch.Tensor | None = cross_view(caches, lay, what)
        assert kv is not None
        views = [kv[:, li] for li in range(kv.shape[1])]
        tensors = [caches] * len(views)
    else:
        kv, tensors = None, _layers_of(caches, what)
        views = [layer_view(t, lay, f"{what} layer {li}") for li, t in enumerate(tensors)]
    if len(views) != want.num_layers:
        raise ValueError(f"{what}: {len(views)} layers, the geometry has {want.num_layers}")
    block = (want.num_fields, *want.block_shape[2:])  # [K, a, b, D]
    problems = []
    for li, (v, t) in enumerate(zip(views, tensors, strict=True)):
        if tuple(v.shape[1:]) != block:
            problems.append(
                f"layer {li}: blocks of {tuple(v.shape[1:])} ([K, a, b, D] in "
                f"{want.layout}), the geometry's are {block}"
            )
        if t.dtype != want.dtype:
            problems.append(f"layer {li}: dtype {t.dtype}, the geometry's is {want.dtype}")
        if v.shape[0] != views[0].shape[0] or t.device != tensors[0].device:
            problems.append(
                f"layer {li}: {v.shape[0]} blocks on {t.device}, layer 0 has "
                f"{views[0].shape[0]} on {tensors[0].device}"
            )
        if cross and problems:
            break  # one tensor: said once
    if problems:
        raise ValueError(f"{what} do not match the geometry: " + "; ".join(problems))
    if views[0].shape[0] < 1:
        raise ValueError(f"{what}: 0 blocks")
    return RegisteredPool(want, views, kv)


def register_kv_caches(
    geometry: KVGeometry,
    caches: Caches | None = None,
    layout: str = "flash_attn",
    *,
    cross_layer: bool = False,
    ranks: Sequence[Caches] | None = None,
    disabled_guards: Sequence[str] = (),
) -> RegisteredPools:
    """The engine's caches of every TP rank of ``geometry`` held here (``caches`` for
    one rank, ``ranks=[...]`` for each), as pools the ``Sender``/``Receiver`` take."""
    if (caches is None) == (ranks is None):
        raise ValueError("register_kv_caches: give caches= (one rank) or ranks= (each rank)")
    per_rank: list[Any] = [caches] if ranks is None else list(ranks)
    if len(per_rank) != geometry.tp:
        raise ValueError(
            f"register_kv_caches: {len(per_rank)} ranks of caches, the geometry "
            f"has tp={geometry.tp}"
        )
    want = geometry.rank_pool_geometry()
    mems = [
        _rank_pool(want, c, layout, cross_layer, f"rank {r} caches") for r, c in enumerate(per_rank)
    ]
    if len({m.capacity for m in mems}) != 1:
        raise ValueError(f"register_kv_caches: ranks hold {[m.capacity for m in mems]} blocks")
    return RegisteredPools(
        geometry.tp,
        geometry.kv_heads,
        want,
        mems[0].capacity,
        disabled_guards=disabled_guards,
        memory=mems,
        table=EngineBlocks,
    )
