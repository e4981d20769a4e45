"""Paged KV storage for one location: a torch tensor of blocks plus its BlockAllocator.

    kv: [capacity, layers, fields, kv_heads, block_size, head_dim]   (heads_major)
        [capacity, layers, fields, block_size, kv_heads, head_dim]   (tokens_major)

``fields`` is the per-layer cache fields (2 for K and V). One block, ``kv[b]``, is a
contiguous slab, so it moves and hashes as one byte range. The bookkeeping (who holds
which block) lives in ``pool.allocator`` and knows nothing of tensors; the tensor code
here asks it before every write (``check_write``), so a frozen, shared or foreign block
is never overwritten.

Placement: the device pool is on CUDA when available, CPU otherwise; the host pool is
CPU memory, pinned when CUDA is present (so D2H/H2D copies can run asynchronously).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from refimpl.blocks import BlockAllocator
from refimpl.checksum import Buffer, byte_view, copy_bytes_into, tensor_from_bytes
from refimpl.errors import ChunkError
from refimpl.memory.interface import BlockMemory
from refimpl.memory.views import write_bytes
from spec.manifest import LocalConfig, Manifest
from spec.shardmap import LAYOUTS

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
}


@dataclass(frozen=True, slots=True)
class PoolGeometry:
    """Shape of one block as stored in one pool (per TP rank: its local heads)."""

    num_layers: int
    num_fields: int  # per-layer cache fields, 2 for (k, v)
    kv_heads: int  # heads held by this pool
    block_size: int  # tokens per block
    head_dim: int
    dtype: torch.dtype
    layout: str = "heads_major"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}")
        dims = (self.num_layers, self.num_fields, self.kv_heads, self.block_size, self.head_dim)
        if min(dims) < 1:
            raise ValueError(f"block dims must be >= 1, got {dims}")

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        heads, slots = self.kv_heads, self.block_size
        if self.layout == "tokens_major":
            heads, slots = slots, heads
        return (self.num_layers, self.num_fields, heads, slots, self.head_dim)

    @property
    def block_numel(self) -> int:
        return self.num_layers * self.num_fields * self.kv_heads * self.block_size * self.head_dim

    @property
    def block_bytes(self) -> int:
        return self.block_numel * self.dtype.itemsize

    @classmethod
    def of_local(cls, local: LocalConfig, kv_heads: int | None = None) -> PoolGeometry:
        """The receiver's block shape; ``kv_heads`` overrides for one TP rank's shard."""
        return cls(
            local.num_layers,
            len(local.cache_fields),
            kv_heads or local.kv_heads,
            local.block_size,
            local.head_dim,
            TORCH_DTYPES[local.dtype],
            local.layout,
        )

    @classmethod
    def of_manifest(cls, m: Manifest) -> PoolGeometry:
        """The block shape the sender's chunks carry (unsharded, tp=1 view)."""
        return cls(
            m.num_layers,
            len(m.cache_fields),
            m.kv_heads,
            m.block_size,
            m.head_dim,
            TORCH_DTYPES[m.dtype],
            m.layout,
        )


def check_block_source(g: PoolGeometry, src_g: PoolGeometry, nbytes: int) -> None:
    """Refuse a block's bytes of another shape than ``g`` (only the layout may differ)."""
    if (
        src_g.num_layers,
        src_g.num_fields,
        src_g.kv_heads,
        src_g.block_size,
        src_g.head_dim,
        src_g.dtype,
    ) != (g.num_layers, g.num_fields, g.kv_heads, g.block_size, g.head_dim, g.dtype):
        raise ChunkError(f"chunk geometry {src_g} does not match pool {g}; reshard first")
    if nbytes != g.block_bytes:
        raise ChunkError(f"chunk of {nbytes} bytes for a {g.block_bytes}-byte block")


class KVPool(BlockMemory):
    """Blocks of KV at one location, in a tensor of kvown's (``BlockMemory``)."""

    def __init__(
        self,
        capacity: int,
        geometry: PoolGeometry,
        *,
        device: str | torch.device = "cpu",
        pin_memory: bool = False,
        disabled_guards: Iterable[str] = (),
    ) -> None:
        self.geometry = geometry
        self.device = torch.device(device)
        # kv: [capacity, *geometry.block_shape]; zeros so unwritten pages are recognisable
        self._kv = torch.zeros(
            (capacity, *geometry.block_shape),
            dtype=geometry.dtype,
            device=self.device,
            pin_memory=pin_memory,
        )
        self.allocator = BlockAllocator(capacity, disabled_guards=disabled_guards)
        # Transfers on CUDA run on their own stream so they never queue behind decode.
        self.copy_stream = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.device.type == "cuda"
            else None
        )

    @classmethod
    def device_pool(cls, capacity: int, geometry: PoolGeometry, **kw: object) -> KVPool:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(capacity, geometry, device=device, **kw)  # type: ignore[arg-type]

    @classmethod
    def host_pool(cls, capacity: int, geometry: PoolGeometry, **kw: object) -> KVPool:
        pin = torch.cuda.is_available()
        return cls(capacity, geometry, device="cpu", pin_memory=pin, **kw)  # type: ignore[arg-type]

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    @property
    def kv(self) -> torch.Tensor:
        return self._kv

    def layer(self, layer: int) -> torch.Tensor:
        return self._kv.select(1, layer)

    def clear(self) -> None:
        self._kv.zero_()

    # ------------------------------------------------------------ reads (no checks)
    def block(self, b: int) -> torch.Tensor:
        """A view of block ``b``: [layers, fields, heads|slots, slots|heads, head_dim]."""
        return self.kv[b]

    def read_blocks(self, block_ids: Sequence[int]) -> torch.Tensor:
        """A copy of the given blocks, stacked in order: [n, *block_shape]."""
        return self.kv[torch.as_tensor(list(block_ids), dtype=torch.long, device=self.device)]

    def host_bytes(self, block_ids: Sequence[int]) -> list[memoryview]:
        """One read-only byte view per block; zero-copy on CPU, one staged D2H copy on CUDA.

        The views alias pool memory: they stay valid, and unchanged, only while the blocks
        are pinned (``allocator.incref``), which is what a frozen snapshot does.
        """
        if self.device.type == "cpu" and self.kv.is_contiguous():  # one view, sliced
            whole, per = byte_view(self.kv), self.geometry.block_bytes
            return [whole[b * per : (b + 1) * per] for b in block_ids]
        if self.device.type == "cpu":
            return [byte_view(self.kv[b]) for b in block_ids]
        assert self.copy_stream is not None
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.device)
        staged = torch.empty(
            (len(block_ids), *self.geometry.block_shape), dtype=self.geometry.dtype, pin_memory=True
        )
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            staged.copy_(self.kv[idx], non_blocking=True)
        self.copy_stream.synchronize()
        return [byte_view(staged[i]) for i in range(len(block_ids))]

    # ------------------------------------------------------------ writes (checked)
    def write_block(self, holder: str, b: int, src: torch.Tensor) -> None:
        """Copy ``src`` ([*block_shape]) into block ``b``; ``holder`` must be its one writer."""
        self.allocator.check_write(holder, [b])
        self.kv[b].copy_(src)

    def write_blocks(self, holder: str, block_ids: Sequence[int], src: torch.Tensor) -> None:
        """Copy ``src`` ([n, *block_shape]) into the blocks, all checked before any write."""
        self.allocator.check_write(holder, block_ids)
        if len(block_ids) != src.shape[0]:
            raise ValueError(f"{len(block_ids)} block ids for {src.shape[0]} source blocks")
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.device)
        self.kv.index_copy_(0, idx, src.to(self.device, non_blocking=True))

    def write_block_bytes(
        self, holder: str, b: int, data: Buffer, src_geometry: PoolGeometry | None = None
    ) -> None:
        """Install one block from raw bytes with a single copy_ (H2D on CUDA).

        ``src_geometry`` is the sender's block shape; a different layout is permuted on
        the fly (heads_major <-> tokens_major). Other differences are refused here.
        """
        g, src_g = self.geometry, src_geometry or self.geometry
        check_block_source(g, src_g, len(data))
        self.allocator.check_write(holder, [b])
        if self.device.type == "cpu" and src_g.layout == g.layout:
            # One single-threaded memcpy: a per-block torch copy_ forks and joins its
            # thread pool each time, which costs milliseconds when cores are contended.
            copy_bytes_into(self.kv[b], data)
            return
        src = tensor_from_bytes(data, g.dtype, src_g.block_shape)
        if src_g.layout != g.layout:
            src = src.transpose(2, 3)  # swap the heads and slots axes
        self.kv[b].copy_(src)

    def write_raw(self, b: int, payload: Buffer) -> None:
        write_bytes(self._kv[b], payload)


def _runs(src_ids: Sequence[int], dst_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(src_start, dst_start, length) runs where both id lists advance by one."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src_ids, dst_ids, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def copy_blocks(
    src: BlockMemory,
    src_ids: Sequence[int],
    dst: BlockMemory,
    dst_ids: Sequence[int],
    holder: str,
) -> None:
    """Copy blocks pool to pool (offload D2H, reload H2D): one ``copy_`` per run of ids.

    ``holder`` must be the one writer of every destination block (checked before any
    copy). On CUDA the copies run on a transfer stream, never the compute stream, and the
    call returns once they have landed.
    """
    if src.geometry != dst.geometry:
        raise ChunkError(f"geometry {src.geometry} != {dst.geometry}; reshard instead")
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source ids for {len(dst_ids)} destination ids")
    dst.allocator.check_write(holder, dst_ids)
    stream = dst.copy_stream or src.copy_stream
    if stream is None:
        for s, d, n in _runs(src_ids, dst_ids):
            dst.kv[d : d + n].copy_(src.kv[s : s + n])
        return
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        for s, d, n in _runs(src_ids, dst_ids):
            dst.kv[d : d + n].copy_(src.kv[s : s + n], non_blocking=True)
    stream.synchronize()
