"""Layer by layer: the receiver's record of a streamed attempt, and one layer's install.

A streamed offer (``Sender.offer(..., layers=L)``) sends one chunk per (source rank,
layer), that layer of every sent block in block order, as prefill computes each layer
(``Sender.send_layer``, the shape of a KV connector's ``save_kv_layer``), then one
``seal`` per source rank with the xxh3-64 of each of its blocks (the same convention as
a whole-block chunk's checksum: the rank's block bytes, layer 0 first; a tp=1
heads_major block is the manifest's canonical block).

The receiver checks each layer chunk against its header's checksum, installs it, and
hashes it into its block's digest in layer order (a layer that arrives early waits, as
a copy, for the one before it): one pass over the bytes. The seal covers the bytes that
arrived; their landing (heads resharded, axes permuted) is not hashed again, unlike the
whole-block path's end-to-end check of every non-canonical block. ``layer_ready(layer)`` says that
every sent block of every source rank has that layer installed: the decode side may wait
on it (``wait_for_layer_load``), but the blocks are still RESERVED: the request owns
them only once every digest matched its seal and the attempt committed. A failure at any
point gives back every block, landed layers included.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import torch
import xxhash

from refimpl.api.wire import SEAL as SEAL
from refimpl.checksum import Buffer, tensor_from_bytes
from refimpl.engine.data import RankPools
from refimpl.errors import ChecksumError, ChunkError
from refimpl.memory.views import scatter_layer, write_bytes
from refimpl.pool import PoolGeometry
from spec import shardmap as sm

_HEX = re.compile(r"[0-9a-f]{16}")


class LayerStream:
    """Which (rank, block, layer) landed (a chunk lands a run of blocks of one layer),
    each block's running digest, and the seals."""

    def __init__(self, num_layers: int, ranks: Sequence[int], num_blocks: int) -> None:
        self.num_layers, self.ranks, self.num_blocks = num_layers, list(ranks), num_blocks
        self.landed: set[tuple[int, int, int]] = set()  # (rank, block j, layer) installed
        self.per_layer: Counter[int] = Counter()  # layer -> (rank, j) installed
        self._hash = {(r, j): xxhash.xxh3_64() for r in ranks for j in range(num_blocks)}
        self._next = dict.fromkeys(self._hash, 0)  # the next layer to hash, per (rank, j)
        self._early: dict[tuple[int, int, int], bytes] = {}  # landed before its predecessor
        self.seals: dict[int, tuple[str, ...]] = {}

    def layer_ready(self, layer: int) -> bool:
        return self.per_layer[layer] == len(self.ranks) * self.num_blocks

    def layers_ready(self) -> int:
        """How many leading layers are ready (the decode side may run that far)."""
        n = 0
        while n < self.num_layers and self.layer_ready(n):
            n += 1
        return n

    def check_layer(self, layer: object) -> int:
        """The chunk's layer, or ChunkError naming what is wrong with its header."""
        if type(layer) is not int or not 0 <= layer < self.num_layers:
            raise ChunkError(
                f"layer {layer!r} of a streamed chunk; layers 0..{self.num_layers - 1}"
            )
        return layer

    def landed_one(self, rank: int, j: int, layer: int, payload: Buffer) -> None:
        """Count an installed layer and hash it into its block's digest, in layer order."""
        self.landed.add((rank, j, layer))
        self.per_layer[layer] += 1
        key = (rank, j)
        if layer != self._next[key]:
            self._early[(rank, j, layer)] = bytes(payload)
            return
        self._hash[key].update(payload)
        nxt = layer + 1
        while (rank, j, nxt) in self._early:
            self._hash[key].update(self._early.pop((rank, j, nxt)))
            nxt += 1
        self._next[key] = nxt

    def seal(self, rank: object, digests: object) -> None:
        """Take one source rank's per-block digests (ChunkError if malformed or changed)."""
        if type(rank) is not int or rank not in self.ranks:
            raise ChunkError(f"seal of rank {rank!r}; senders {self.ranks}", prop="RankAgreement")
        if (
            not isinstance(digests, list)
            or len(digests) != self.num_blocks
            or not all(isinstance(d, str) and _HEX.fullmatch(d) for d in digests)
        ):
            raise ChunkError(
                f"seal of rank {rank}: digests {digests!r:.80} are not {self.num_blocks} xxh3-64"
            )
        if self.seals.get(rank, tuple(digests)) != tuple(digests):
            raise ChunkError(f"rank {rank} sealed twice with other digests")
        self.seals[rank] = tuple(digests)

    def complete(self) -> bool:
        full = len(self.landed) == len(self._hash) * self.num_layers
        return full and len(self.seals) == len(self.ranks)

    def verify(self, first_block: int) -> int:
        """Every block's digest against its rank's seal; returns the comparisons made."""
        for (r, j), h in self._hash.items():
            got, want = h.hexdigest(), self.seals[r][j]
            if got != want:
                raise ChecksumError(
                    f"block {first_block + j} (rank {r}): its layers hash to {got}, "
                    f"not the sealed {want}"
                )
        return len(self._hash)


def land_layer(
    dst: RankPools,
    pieces: Sequence[sm.HeadPiece],
    src_geometry: PoolGeometry,
    payload: Buffer,
    b: int,
    layer: int,
) -> None:
    """Write one source rank's layer of a block into block ``b`` of the destination ranks
    (``land_shard`` for one layer: heads resharded, axes permuted to this side's)."""
    whole = slice(0, dst.geometry.kv_heads)
    if len(pieces) == 1 and src_geometry == dst.geometry and pieces[0].src_slice == whole:
        write_bytes(dst.pools[pieces[0].dst_rank].layer(layer)[b], payload)
        return
    shard = tensor_from_bytes(payload, src_geometry.dtype, src_geometry.block_shape[1:])
    perm = sm.layout_permutation(src_geometry.layout, sm.LAYOUTS[0])
    shard = shard.permute([p - 1 for p in perm[1:]])  # [fields, heads, slots, dim]
    for pc in pieces:
        view = dst.hm_layer(pc.dst_rank, layer, b)
        view[:, pc.dst_slice].copy_(shard[:, pc.src_slice])


def land_layer_blocks(
    dst: RankPools,
    pieces: Sequence[sm.HeadPiece],
    src_geometry: PoolGeometry,
    payload: Buffer,
    blocks: Sequence[int],
    layer: int,
) -> None:
    """``land_layer`` for one source rank's layer of several blocks at once (``payload``:
    their pieces in block order): one indexed copy where both sides' blocks are the same,
    else block by block."""
    whole = slice(0, dst.geometry.kv_heads)
    if len(pieces) == 1 and src_geometry == dst.geometry and pieces[0].src_slice == whole:
        scatter_layer(dst.pools[pieces[0].dst_rank].layer(layer), blocks, payload)
        return
    view, per = memoryview(payload).cast("B"), src_geometry.block_bytes // src_geometry.num_layers
    for j, b in enumerate(blocks):
        land_layer(dst, pieces, src_geometry, view[j * per : (j + 1) * per], b, layer)


def write_layer_blocks(
    kv: torch.Tensor, layer: int, blocks: Sequence[int], payload: Buffer
) -> None:
    """Layer ``layer`` of ``blocks`` of a pool's ``kv`` from their bytes in block order
    (the pool's own layout): one memcpy per block on CPU, one indexed copy elsewhere."""
    scatter_layer(kv.select(1, layer), blocks, payload)
