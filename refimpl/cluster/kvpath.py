"""The KV data path of one cluster process: the seam onto the refimpl library.

Everything a worker does to KV bytes goes through here, built on ``refimpl.chunks``
(``freeze``/``release``/``build_manifest``: pins, epochs, the manifest),
``refimpl.checksum`` (xxh3), ``refimpl.blocks`` (the allocator and its
``check_integrity``) and ``refimpl.reshard``; the pools and the model's paged view come
from ``refimpl.demo.handoff.Worker``. When the public handoff API lands
(``refimpl/api``), this is the one file to swap.

Prefill rank r of T (``PrefillKV``). The tiny model computes its projections unsplit
(``refimpl/model.py``), so every prefill rank process runs the whole prompt; each keeps
the pools of all T ranks in its process but ships only rank r's shard (its heads), as
one flat byte tensor of its sent blocks over torch.distributed. Per block it states the
xxh3 of its shard bytes; the leader's manifest states, per block, the xxh3 of the T
ranks' shard checksums joined (``combine``), so the manifest binds every rank's bytes.

Decode (``DecodeKV``, TP=1). It validates the manifest (``check_compatible``), reserves
its target blocks and a staging pool in the sender's geometry, verifies each rank's
bytes block by block against that rank's checksums and then the manifest's, lands them
in staging, reshards into the target (TP T -> 1), commits, and decodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import xxhash

from refimpl.checksum import byte_view, bytes_checksum
from refimpl.chunks import Snapshot, build_manifest, freeze, pin_name
from refimpl.demo.handoff import Worker, pool_geometry
from refimpl.engine.data import RankPools
from refimpl.errors import ChecksumError, IncompleteError, ManifestError
from refimpl.model import PagedKV, TinyDecoder, decode
from refimpl.pool import TORCH_DTYPES
from refimpl.reshard import KVLayout, ShardedKV, reshard
from spec import shardmap as sm
from spec.manifest import Manifest, check_compatible
from spec.manifest import ManifestError as SpecManifestError
from spec.manifest import from_json_dict as manifest_from_json

LAYOUT = "heads_major"
RAW_TAG = 1 << 29  # tags of the benchmark's raw transfers (above every data_tag)


def data_tag(rid: str, epoch: int) -> int:
    """The point-to-point tag of one attempt's shard (the same on both ends)."""
    return (xxhash.xxh32_intdigest(rid.encode()) & 0xFFFFFF) * 16 + epoch


def combine(rank_sums: Sequence[str]) -> str:
    """The manifest's checksum of one block: xxh3 over its ranks' shard checksums."""
    return xxhash.xxh3_64_hexdigest(":".join(rank_sums).encode())


class PrefillKV:
    """One prefill TP rank's pools and model."""

    def __init__(self, model: TinyDecoder, tp: int, rank: int, block_size: int, cap: int):
        self.tp, self.rank = tp, rank
        self.w = Worker(model, tp=tp, block_size=block_size, layout=LAYOUT, capacity=cap)
        self.snaps: dict[tuple[str, int], Snapshot] = {}

    @property
    def alloc(self):  # type: ignore[no-untyped-def]
        return self.w.rp.alloc

    def can_admit(self, n_tokens: int) -> bool:
        return bool(self.alloc.can_allocate(sm.blocks_needed(n_tokens, self.w.block_size)))

    def prefill(self, rid: str, prompt: Sequence[int]) -> int:
        """Allocate, run the prompt; returns the first (greedy) token."""
        logits, _ = self.w.prefill(rid, torch.tensor(list(prompt)))
        return int(logits[-1].argmax())

    def freeze(self, rid: str, epoch: int) -> list[str]:
        """Pin this rank's blocks for the attempt; the xxh3 of each block's shard."""
        snap = freeze(self.w.rp.pools[self.rank], rid, epoch)
        self.snaps[(rid, epoch)] = snap
        return list(snap.checksums)

    def payload(self, rid: str, epoch: int) -> torch.Tensor:
        """This rank's sent blocks as one flat uint8 tensor (a copy; the pins stay)."""
        snap = self.snaps[(rid, epoch)]
        pool = self.w.rp.pools[self.rank]
        idx = torch.as_tensor(list(snap.block_ids), dtype=torch.long)
        return pool.kv[idx].contiguous().view(torch.uint8).reshape(-1)

    def manifest(
        self, rid: str, epoch: int, tokens: Sequence[int], sums: list[list[str]]
    ) -> Manifest:
        """The leader's manifest; ``sums[r][j]``: rank r's checksum of block j."""
        snap = self.snaps[(rid, epoch)]
        combined = tuple(combine([s[j] for s in sums]) for j in range(len(snap.block_ids)))
        joint = Snapshot(rid, epoch, snap.block_ids, 0, combined, ())
        return build_manifest(joint, self.w.local, token_ids=tokens, dst_tp=1, dst_cp=1)

    def release(self, rid: str, epoch: int) -> None:
        """Drop the attempt's pin (the snapshot is no longer needed)."""
        snap = self.snaps.pop((rid, epoch), None)
        if snap is not None:
            self.alloc.decref(snap.pin, snap.block_ids)

    def drop(self, rid: str) -> None:
        """The request is over here: every pin and its blocks go."""
        for key in [k for k in self.snaps if k[0] == rid]:
            self.release(*key)
        self.alloc.free(rid)

    def held(self) -> int:
        """Blocks not free (0 once every request is over)."""
        c = self.alloc.counts()
        return int(c["reserved"] + c["owned"] + c["quarantined"])


@dataclass
class Incoming:
    """Decode's side of one attempt."""

    m: Manifest
    own: list[int]  # target blocks (reserved for m.epoch)
    staging: RankPools
    stage_ids: list[int]
    landed: set[int]  # source ranks whose bytes are verified and staged


class DecodeKV:
    """The decode worker's pools (TP=1) and model."""

    def __init__(self, model: TinyDecoder, block_size: int, cap: int):
        self.model = model
        self.w = Worker(model, tp=1, block_size=block_size, layout=LAYOUT, capacity=cap)

    @property
    def alloc(self):  # type: ignore[no-untyped-def]
        return self.w.rp.alloc

    def accept(self, manifest: object) -> Manifest:
        """Parse and check an untrusted manifest; ManifestError lists every reason."""
        try:
            m = manifest_from_json(manifest)
        except SpecManifestError as e:
            raise ManifestError.from_spec(e) from None
        verdict = check_compatible(m, self.w.local)
        if not verdict.ok:
            raise ManifestError(list(verdict.reasons))
        return m

    def can_reserve(self, m: Manifest, room: int) -> bool:
        return bool(
            self.alloc.can_allocate(sm.blocks_needed(m.num_tokens + room, self.w.block_size))
        )

    def reserve(self, m: Manifest, room: int) -> Incoming:
        rid, bs = m.request_id, self.w.block_size
        own = self.alloc.reserve(rid, sm.blocks_needed(m.num_tokens + room, bs), epoch=m.epoch)
        geo = pool_geometry(
            m.num_layers, m.kv_heads, m.head_dim, TORCH_DTYPES[m.dtype], m.src_tp,
            m.block_size, m.layout,
        )  # fmt: skip
        n = len(m.sent_blocks)
        staging = RankPools(m.src_tp, m.kv_heads, geo, max(n, 1), device="cpu")
        ids = staging.alloc.reserve(rid, n, epoch=m.epoch)
        return Incoming(m, own, staging, ids, set())

    def rank_bytes(self, inc: Incoming) -> int:
        """The byte size of one source rank's payload."""
        return len(inc.stage_ids) * inc.staging.geometry.block_bytes

    def land(self, inc: Incoming, rank: int, data: torch.Tensor, sums: Sequence[str]) -> None:
        """Verify one rank's bytes block by block, then stage them (nothing on failure)."""
        m, g = inc.m, inc.staging.geometry
        n = len(inc.stage_ids)
        if len(sums) != n or data.numel() != n * g.block_bytes:
            raise IncompleteError(f"rank {rank}: {len(sums)} sums, {data.numel()} bytes")
        views = [byte_view(data[j * g.block_bytes : (j + 1) * g.block_bytes]) for j in range(n)]
        for j, v in enumerate(views):
            if bytes_checksum(v) != sums[j]:
                raise ChecksumError(f"{m.request_id} rank {rank} block {j}: bytes != RankDone")
        for j, v in enumerate(views):
            inc.staging.pools[rank].write_block_bytes(m.request_id, inc.stage_ids[j], v)
        inc.landed.add(rank)

    def validate(self, inc: Incoming, sums: dict[int, list[str]]) -> None:
        """Every rank landed, and the ranks' checksums are the manifest's."""
        m = inc.m
        missing = sorted(set(inc.staging.primaries) - inc.landed)
        if missing:
            raise IncompleteError(f"{m.request_id}: ranks {missing} have not landed")
        for j in range(len(inc.stage_ids)):
            if combine([sums[r][j] for r in range(m.src_tp)]) != m.block_checksums[j]:
                raise ChecksumError(f"{m.request_id} block {j}: ranks != manifest checksum")

    def commit(self, inc: Incoming) -> PagedKV:
        """Reshard staging into the target blocks, then RESERVED -> OWNED."""
        m, rid = inc.m, inc.m.request_id
        decl = KVLayout(
            m.layout, m.num_layers, m.kv_heads, m.block_size, m.head_dim, m.src_tp, m.src_cp
        )
        src = ShardedKV(decl, [[p.kv] for p in inc.staging.pools], [inc.stage_ids], m.num_tokens)
        self.alloc.check_write(rid, inc.own)
        store = self.w.store(inc.own, m.num_tokens)
        if inc.stage_ids:
            reshard(src, store.kv, start=0)
        self.alloc.commit(rid, m.epoch)
        return store

    def decode(self, store: PagedKV, first: int, position: int, steps: int) -> tuple[int, ...]:
        return decode(self.model, first, position, steps, store)[1]

    def abort(self, rid: str) -> None:
        """Give back an attempt's blocks: nothing of it can land any more (bytes land
        only in the private receive buffers, never in a pool, until verified)."""
        if self.alloc.blocks_of(rid):
            self.alloc.quarantine(rid)
            self.alloc.unquarantine_and_free(rid)

    def finish(self, rid: str) -> None:
        self.alloc.free(rid)

    def held(self) -> int:
        c = self.alloc.counts()
        return int(c["reserved"] + c["owned"] + c["quarantined"])


__all__ = ["RAW_TAG", "DecodeKV", "Incoming", "PrefillKV", "combine", "data_tag", "pin_name"]
