"""Contiguous per-token KV <-> a request's paged blocks, batched, asking the allocator.

    fields[l][f]   [kv_heads, T, head_dim]        one layer's K (f=0), V (f=1), all heads
    read_kv(...)   [layers, fields, kv_heads, T, head_dim]   contiguous

The blocks are the request's, in logical order (token t is in ``blocks[t // block_size]``
at slot ``t % block_size``). Every TP rank's pool gets its heads (replicas included); a
write is refused unless ``holder`` is the one writer of every block (``check_write``),
before anything is written. One strided ``copy_`` per (run of consecutive block ids,
layer, field), no per-token Python loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refimpl.rankpools import RankPools


def _runs(blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first logical block, first physical id, length) of runs of consecutive ids."""
    runs: list[tuple[int, int, int]] = []
    for j, b in enumerate(blocks):
        if runs and runs[-1][1] + runs[-1][2] == b:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((j, b, 1))
    return runs


def _hm(pools: RankPools, rank: int, layer: int, b0: int, n: int) -> torch.Tensor:
    """Layer ``layer`` of blocks [b0, b0+n) of one rank as heads_major [n, fields, h, bs,
    D] (a view of the rank's memory, whichever ``BlockMemory`` it is)."""
    return pools.pools[rank].layer(layer)[b0 : b0 + n].permute(pools.to_hm)


def _check_tokens(pools: RankPools, blocks: Sequence[int], num_tokens: int) -> None:
    bs = pools.geometry.block_size
    if not 0 <= num_tokens <= len(blocks) * bs:
        raise ValueError(f"{num_tokens} tokens do not fit {len(blocks)} blocks of {bs}")


def write_kv(
    pools: RankPools,
    holder: str,
    blocks: Sequence[int],
    fields: Sequence[Sequence[torch.Tensor]],
) -> None:
    """Write tokens [0, T) of every layer into ``blocks`` (all ranks, replicas included)."""
    g = pools.geometry
    if len(fields) != g.num_layers or any(len(f) != g.num_fields for f in fields):
        raise ValueError(
            f"need {g.num_layers} layers x {g.num_fields} fields, got "
            f"{len(fields)} x {sorted({len(f) for f in fields})}"
        )
    _write(pools, holder, blocks, list(enumerate(fields)))


def write_kv_layer(
    pools: RankPools,
    holder: str,
    blocks: Sequence[int],
    layer: int,
    fields: Sequence[torch.Tensor],
) -> None:
    """Write tokens [0, T) of one layer (as prefill computes it; then ``send_layer``)."""
    g = pools.geometry
    if type(layer) is not int or not 0 <= layer < g.num_layers or len(fields) != g.num_fields:
        raise ValueError(
            f"layer {layer!r} with {len(fields)} fields; layers 0..{g.num_layers - 1}, "
            f"{g.num_fields} fields"
        )
    _write(pools, holder, blocks, [(layer, fields)])


def _write(
    pools: RankPools,
    holder: str,
    blocks: Sequence[int],
    items: Sequence[tuple[int, Sequence[torch.Tensor]]],
) -> None:
    g = pools.geometry
    fields = [f for _, f in items]
    shape = fields[0][0].shape
    want = (pools.kv_heads, shape[1] if len(shape) == 3 else -1, g.head_dim)
    for layer in fields:
        for t in layer:
            if tuple(t.shape) != want:
                raise ValueError(f"a field of shape {tuple(t.shape)}; expected {want}")
    n_tok, bs = want[1], g.block_size
    _check_tokens(pools, blocks, n_tok)
    pools.alloc.check_write(holder, blocks[: -(-n_tok // bs)])
    full = n_tok // bs
    for j0, b0, n in _runs(blocks[:full]):
        for r in range(pools.tp):
            h = pools.heads[r]
            for li, layer in items:
                dst = _hm(pools, r, li, b0, n)  # [n, F, h, bs, D]
                for fi, t in enumerate(layer):
                    src = t[h.start : h.stop, j0 * bs : (j0 + n) * bs]  # [h, n*bs, D]
                    dst[:, fi].copy_(src.reshape(len(h), n, bs, -1).transpose(0, 1))
    tail = n_tok - full * bs
    if tail:
        for r in range(pools.tp):
            h = pools.heads[r]
            for li, layer in items:
                dst = _hm(pools, r, li, blocks[full], 1)[0]  # [F, h, bs, D]
                for fi, t in enumerate(layer):
                    dst[fi, :, :tail].copy_(t[h.start : h.stop, full * bs :])


def read_kv(
    pools: RankPools, blocks: Sequence[int], num_tokens: int, *, layer: int | None = None
) -> torch.Tensor:
    """Tokens [0, num_tokens) held in ``blocks``: [layers, fields, kv_heads, T, D]; with
    ``layer``, that layer only: [fields, kv_heads, T, D]."""
    g = pools.geometry
    _check_tokens(pools, blocks, num_tokens)
    if layer is not None and (type(layer) is not int or not 0 <= layer < g.num_layers):
        raise ValueError(f"layer {layer!r}; layers 0..{g.num_layers - 1}")
    ls = range(g.num_layers) if layer is None else [layer]
    out = torch.empty(
        (
            g.num_layers if layer is None else 1,
            g.num_fields,
            pools.kv_heads,
            num_tokens,
            g.head_dim,
        ),
        dtype=g.dtype,
        device=pools.device,
    )
    bs, full = g.block_size, num_tokens // g.block_size
    for r in pools.primaries:
        h = pools.heads[r]
        for k, li in enumerate(ls):
            for j0, b0, n in _runs(blocks[:full]):
                src = _hm(pools, r, li, b0, n).permute(1, 2, 0, 3, 4)  # [F, h, n, bs, D]
                dst = out[k, :, h.start : h.stop, j0 * bs : (j0 + n) * bs]
                dst.view(*dst.shape[:2], n, bs, g.head_dim).copy_(src)  # a view: splits T
            tail = num_tokens - full * bs
            if tail:
                src = _hm(pools, r, li, blocks[full], 1)[0]  # [F, h, bs, D]
                out[k, :, h.start : h.stop, full * bs :].copy_(src[:, :, :tail])
    return out if layer is None else out[0]
