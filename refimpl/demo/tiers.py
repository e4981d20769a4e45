"""The tiers in ``kvown demo``: a disk round trip, and swap or recompute per tier, measured.

``disk_round_trip`` moves a request's blocks device -> disk -> device with the API's
verified ``offload``/``reload`` and a ``DiskTier`` (a published safetensors file, read
back and checked block by block). ``measure_tiers`` times the same API round trips to
host pools and to a disk directory, at two sizes, for each tier's store and load rate and
its fixed cost (the disk's fsync and rename); ``measure_prefill`` times the demo model's
prefill. ``choices`` feeds them to ``costmodel.swap_or_recompute_per_tier`` for a few
request lengths of the demo model: the choice and its reason, from the bytes and the
rates measured on this machine (a CPU run: "device" and host are the same memory).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from refimpl import costmodel as cm
from refimpl.api import DiskTier, KVGeometry, ModelIdentity, offload, reload
from refimpl.demo.handoff import Worker
from refimpl.engine.data import gen
from refimpl.model import TinyConfig, TinyDecoder
from spec.manifest import DTYPE_BYTES, RopeConfig

LENGTHS = (13, 1024, 32768)  # the demo's prompt, then longer requests of the same model
_PROBE = KVGeometry(4, 4, 64, 16, "float32")  # 128 KiB blocks
_PROBE_MODEL = ModelIdentity("tier-probe", RopeConfig(10000.0, 64))


def disk_round_trip(
    w: Worker, rid: str, token_ids: Sequence[int], room: int, directory: Path
) -> tuple[list[int], int, int]:
    """Move ``rid``'s blocks device -> disk -> device (new block ids). Returns (the new
    block table, checksums verified, bytes in the published file)."""
    tier = DiskTier(directory, w.identity)
    stored = offload(w.rp, w.geometry, tier, None, rid, token_ids, free_device=True)
    back = reload(
        DiskTier(directory, w.identity), None, w.rp, w.geometry, rid, token_ids, decode_room=room
    )
    return list(back.blocks), stored.checks + back.checks, stored.nbytes


def _round_trip_s(kind: str, blocks: int, directory: Path) -> tuple[float, float, int]:
    g = _PROBE
    dev = g.make_pools(blocks)
    ids = dev.alloc.allocate("probe", blocks, epoch=0)
    dev.pools[0].kv[ids] = gen(dev.pools[0].kv[ids].shape, g.torch_dtype, "probe", blocks)
    tokens = list(range(blocks * g.block_size))
    t0 = time.perf_counter()
    if kind == "disk":
        tier = DiskTier(directory, _PROBE_MODEL)
        offload(dev, g, tier, None, "probe", tokens, free_device=True)
        t1 = time.perf_counter()
        reload(tier, None, dev, g, "probe", tokens)
    else:
        pools = g.make_pools(blocks)
        offload(dev, g, pools, g, "probe", tokens, free_device=True)
        t1 = time.perf_counter()
        reload(pools, g, dev, g, "probe", tokens)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, blocks * g.rank_pool_geometry().block_bytes


def measure_tiers(directory: Path, *, small: int = 1, big: int = 16) -> list[cm.Tier]:
    """Host and disk tiers, each timed through the API at ``small`` and ``big`` blocks."""
    out = []
    for kind in ("host", "disk"):
        so, si, sb = _round_trip_s(kind, small, directory)
        bo, bi, bb = _round_trip_s(kind, big, directory)
        bw_out = (bb - sb) / max(bo - so, 1e-9)
        bw_in = (bb - sb) / max(bi - si, 1e-9)
        fixed = max(0.0, so + si - sb / bw_out - sb / bw_in)
        out.append(cm.Tier(kind, bw_out, bw_in, fixed))
    return out


def measure_prefill(cfg: TinyConfig, *, tokens: int = 64, seed: int = 0) -> float:
    """The demo model's prefill rate (tokens/s) on one ``tokens``-long prompt."""
    from refimpl.model import generate

    model = TinyDecoder(cfg, seed=seed)
    prompt = torch.randint(0, cfg.vocab, (tokens,), generator=torch.Generator().manual_seed(seed))
    generate(model, prompt[:4], 1)  # warm
    t0 = time.perf_counter()
    generate(model, prompt, 1)
    return tokens / (time.perf_counter() - t0)


def choices(
    cfg: TinyConfig,
    tiers: Sequence[cm.Tier],
    prefill_tokens_per_s: float,
    lengths: Sequence[int] = LENGTHS,
) -> list[cm.TierChoice]:
    """Swap or recompute, per tier, for requests of ``lengths`` tokens of the demo model."""
    return [
        cm.swap_or_recompute_per_tier(
            n,
            tiers,
            prefill_tokens_per_s,
            num_layers=cfg.layers,
            kv_heads=cfg.kv_heads,
            head_dim=cfg.head_dim,
            dtype_bytes=DTYPE_BYTES[cfg.dtype],
        )
        for n in lengths
    ]
