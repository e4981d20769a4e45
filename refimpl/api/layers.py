"""Layer by layer: the receiver's record of a streamed attempt, and one layer's install.

A streamed offer (``Sender.offer(..., layers=L)``) sends one chunk per (source rank,
layer), that layer of every sent block in block order (or of a run of them), as prefill
computes each layer (``Sender.send_layer``, the shape of a KV connector's
``save_kv_layer``), then one ``seal`` per source rank listing every chunk it sent:
``{"chunks": [[layer, block_index, blocks, checksum], ...]}``, each checksum the
xxh3-64 of that chunk's payload (``refimpl.checksum``, the one convention).

The receiver checks each chunk against its header's checksum before counting it (its
payload hashed, then written; or, where it lands as it is, written into the reserved
blocks and hashed there: ``refimpl.api.install``), and records (layer, run, checksum).
Before the commit, every source rank's installed chunks must be exactly the ones its
seal lists, checksums included (``verify``, else ``ChecksumError``), and every (rank,
block, layer) must have landed: each byte is hashed once per side, and the seal commits
the attempt to the list of chunk checksums. Their landing (heads resharded, axes
permuted) is not hashed again, unlike the whole-block path's end-to-end check of every
non-canonical block. ``layer_ready(layer)`` says that every sent block of every source
rank has that layer installed: the decode side may wait on it (``wait_for_layer_load``),
but the blocks are still RESERVED: the request owns them only once the seals matched and
the attempt committed. A failure at any point gives back every block, landed layers
included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from refimpl.api.wire import SEAL as SEAL
from refimpl.checksum import (
    Buffer,
    is_checksum,
    tensor_from_bytes,
)
from refimpl.engine.data import RankPools
from refimpl.errors import ChecksumError, ChunkError
from refimpl.memory.views import scatter_layer, write_bytes
from refimpl.pool import PoolGeometry
from spec import shardmap as sm

Chunk = tuple[int, int, int, str]  # (layer, block_index, blocks, checksum), as a seal lists it


class Landed:
    """The (rank, block j, layer) installed, read as a set of those triples (``in``,
    ``len``, iteration), kept as one byte per block per (rank, layer): a chunk of a whole
    layer is marked and looked up in one slice, not one tuple per block."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks, self._n = num_blocks, 0
        self._flags: dict[tuple[int, int], bytearray] = {}  # (rank, layer) -> per block

    def seen(self, rank: int, layer: int, j: int, count: int) -> int:
        """How many of blocks j..j+count have ``layer`` of ``rank`` installed."""
        f = self._flags.get((rank, layer))
        return 0 if f is None else f[j : j + count].count(1)

    def mark(self, rank: int, layer: int, j: int, count: int) -> int:
        """Blocks j..j+count have ``layer`` of ``rank`` installed; returns how many are new."""
        f = self._flags.setdefault((rank, layer), bytearray(self.num_blocks))
        new = count - f[j : j + count].count(1)
        f[j : j + count] = b"\x01" * count
        self._n += new
        return new

    def __contains__(self, key: object) -> bool:
        if not (isinstance(key, tuple) and len(key) == 3):
            return False
        r, j, layer = key
        f = self._flags.get((r, layer))
        return f is not None and type(j) is int and 0 <= j < len(f) and f[j] == 1

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        for (r, layer), f in self._flags.items():
            yield from ((r, j, layer) for j, x in enumerate(f) if x)


class LayerStream:
    """Which (rank, block, layer) landed (a chunk lands a run of blocks of one layer),
    each rank's installed chunks with their checksums, and the seals."""

    def __init__(self, num_layers: int, ranks: Sequence[int], num_blocks: int) -> None:
        self.num_layers, self.ranks, self.num_blocks = num_layers, list(ranks), num_blocks
        self.landed = Landed(num_blocks)  # (rank, block j, layer) installed
        self.per_layer: Counter[int] = Counter()  # layer -> (rank, j) installed
        self.chunks: dict[int, dict[tuple[int, int], tuple[int, str]]] = {r: {} for r in ranks}
        # rank -> (layer, j) -> (blocks, checksum) of each chunk installed
        self.seals: dict[int, frozenset[Chunk]] = {}

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

    def landed_chunk(self, rank: int, j: int, count: int, layer: int, checksum: str) -> None:
        """Count an installed chunk (layer ``layer`` of sent blocks j..j+count, whose
        payload hashed to ``checksum``), for its rank's seal."""
        self.per_layer[layer] += self.landed.mark(rank, layer, j, count)
        self.chunks[rank][(layer, j)] = (count, checksum)

    def seal(self, header: Mapping[str, Any]) -> None:
        """Take one source rank's seal: the chunks it sent (ChunkError if malformed or
        changed; compared with the installed ones at ``verify``)."""
        rank, chunks = header.get("rank"), header.get("chunks")
        if type(rank) is not int or rank not in self.ranks:
            raise ChunkError(f"seal of rank {rank!r}; senders {self.ranks}", prop="RankAgreement")
        most = self.num_layers * self.num_blocks  # a chunk is one block at least
        if not isinstance(chunks, list) or len(chunks) > most or not all(map(_entry, chunks)):
            raise ChunkError(
                f"seal of rank {rank}: chunks {chunks!r:.80} are not at most {most} "
                "[layer, block_index, blocks, xxh3-64]"
            )
        got = frozenset(tuple(c) for c in chunks)
        if len(got) != len(chunks):
            raise ChunkError(f"seal of rank {rank}: a chunk listed twice")
        if self.seals.get(rank, got) != got:
            raise ChunkError(f"rank {rank} sealed twice with other chunks")
        self.seals[rank] = got

    def complete(self) -> bool:
        full = len(self.landed) == len(self.ranks) * self.num_blocks * self.num_layers
        return full and len(self.seals) == len(self.ranks)

    def verify(self, first_block: int) -> int:
        """Every rank's installed chunks against its seal; returns the chunks compared."""
        n = 0
        for r in self.ranks:
            have = {(ly, first_block + j, k, c) for (ly, j), (k, c) in self.chunks[r].items()}
            sealed = self.seals[r]
            for ly, i, k, c in sorted(have ^ sealed):
                what = "installed, not in its seal" if (ly, i, k, c) in have else "sealed"
                raise ChecksumError(
                    f"layer {ly} (rank {r}) of blocks {i}+{k}: the chunk hashing to {c} was "
                    f"{what}; the seal and the installed chunks differ"
                )
            n += len(have)
        return n


def _entry(c: object) -> bool:
    """A seal's entry: [layer, block_index, blocks, xxh3-64 hex]."""
    return (
        isinstance(c, list)
        and len(c) == 4
        and all(type(x) is int and x >= 0 for x in c[:3])
        and is_checksum(c[3])
    )


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
