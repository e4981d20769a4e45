"""The engine's seeded test data: deterministic KV (``gen``), stable seeds and the
prefix cache's content-hash chain (``token_chain``).

The pools are ``refimpl.rankpools.RankPools`` (one per TP rank, one block table), the
same type the API's ``Sender``/``Receiver`` hold; a chunk lands through the API's
``refimpl.api.layers.land_shard``. ``RankPools`` is named here too for the modules that
still import it from here (``refimpl/cluster/ends.py``, ``refimpl/testing/on_api``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xxhash

from refimpl.rankpools import RankPools

__all__ = ["RankPools", "gen", "seed_of", "token_chain"]


def seed_of(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (Python's hash() is salted for str)."""
    return xxhash.xxh3_64_intdigest("/".join(map(str, parts)).encode()) & ((1 << 63) - 1)


def gen(shape: Sequence[int], dtype: torch.dtype, *parts: object) -> torch.Tensor:
    """Deterministic normal values for ``parts`` (the stand-in for a model's K/V)."""
    g = torch.Generator().manual_seed(seed_of(*parts))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32).to(dtype)


def token_chain(tokens: Sequence[int], block_size: int) -> list[str]:
    """Content-hash chain over the full token blocks: hash j covers blocks 0..j."""
    out: list[str] = []
    h = ""
    for j in range(len(tokens) // block_size):
        blk = tokens[j * block_size : (j + 1) * block_size]
        h = xxhash.xxh3_64_hexdigest((h + ":" + ",".join(map(str, blk))).encode())
        out.append(h)
    return out
