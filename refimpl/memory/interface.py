"""``BlockMemory``: what the handoff API asks of one TP rank's paged KV memory.

Two implementations: ``refimpl.pool.KVPool`` (kvown allocates a block-major tensor) and
``refimpl.memory.registered.RegisteredPool`` (the engine's own caches, registered once,
read and written in place through views). The API (``refimpl.api``) reaches a pool's
bytes only through these methods; the block ids and who holds each one live in
``allocator`` (a ``refimpl.blocks.BlockAllocator``, shared by the TP ranks of a worker),
never in the memory.

Shapes (``a, b`` = heads, slots in heads_major; slots, heads in tokens_major):

    layer(l)          [capacity, fields, a, b, head_dim]          a view, any strides
    block(b)          [layers, fields, a, b, head_dim]            a view where one exists
    read_blocks(ids)  [n, layers, fields, a, b, head_dim]         a copy
    kv                [capacity, layers, fields, a, b, head_dim]  only where one tensor
                                                                  holds every layer
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from refimpl.checksum import Buffer

if TYPE_CHECKING:
    from refimpl.blocks import BlockAllocator
    from refimpl.pool import PoolGeometry


class BlockMemory(ABC):
    """One TP rank's blocks of KV; ``allocator`` says who holds each block."""

    geometry: PoolGeometry
    device: torch.device
    allocator: BlockAllocator
    copy_stream: Any  # a torch.cuda.Stream for transfers on CUDA, else None

    @property
    @abstractmethod
    def capacity(self) -> int: ...

    @property
    @abstractmethod
    def kv(self) -> torch.Tensor:
        """Every block as one tensor ``[capacity, *block_shape]`` (a view); a memory
        whose layers are separate tensors raises ``TypeError`` naming ``layer``."""

    @abstractmethod
    def layer(self, layer: int) -> torch.Tensor:
        """Layer ``layer`` of every block, ``[capacity, *block_shape[1:]]`` (a view)."""

    @abstractmethod
    def block(self, b: int) -> torch.Tensor:
        """Block ``b``, ``[*block_shape]``: a view where it is one, else a copy (read only)."""

    @abstractmethod
    def read_blocks(self, block_ids: Sequence[int]) -> torch.Tensor:
        """A copy of the given blocks, stacked in order: ``[n, *block_shape]``."""

    @abstractmethod
    def host_bytes(self, block_ids: Sequence[int]) -> list[memoryview]:
        """One read-only byte view per block (its bytes in the pool's layout)."""

    @abstractmethod
    def write_raw(self, b: int, payload: Buffer) -> None:
        """Block ``b`` from its bytes in this pool's layout (unchecked: callers ask the
        allocator first)."""

    @abstractmethod
    def write_block(self, holder: str, b: int, src: torch.Tensor) -> None: ...

    @abstractmethod
    def write_blocks(self, holder: str, block_ids: Sequence[int], src: torch.Tensor) -> None: ...

    @abstractmethod
    def write_block_bytes(
        self, holder: str, b: int, data: Buffer, src_geometry: PoolGeometry | None = None
    ) -> None: ...

    @abstractmethod
    def clear(self) -> None:
        """A crash of the worker: a kvown pool zeroes its memory; an engine's registered
        memory is the engine's, left as it is."""
