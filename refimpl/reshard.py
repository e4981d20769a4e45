"""Resharding real paged KV tensors between TP/CP splits, block sizes and axis orders.

Every placement decision comes from spec/shardmap.py (head pieces, token pieces, slot
runs, axis permutations); this file only turns those plans into `copy_` calls on slices.

Pool of one (TP rank, CP rank), contiguous:
    heads_major   (num_blocks, layers, 2, kv_heads_local, block_size, head_dim)
    tokens_major  (num_blocks, layers, 2, block_size, kv_heads_local, head_dim)
All TP ranks of one CP rank share that CP rank's block table (logical block -> physical id).

Declared vs. present (incident 3, TensorRT-LLM #6507): every pool's shape is checked against
the shape its declared `KVLayout` implies, and a mismatch raises, naming the layout the
buffer does match.  When kv_heads_local == block_size the two layouts have the same shape,
so shape cannot tell them apart: the caller's declared layout is then taken as the truth
(it belongs in the handoff manifest), and pools must be contiguous so that a permuted view
cannot pose as the other layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spec import shardmap as sm

ALL = slice(None)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What one side declares about its paged KV; carried in the handoff manifest."""

    layout: str  # one of spec.shardmap.LAYOUTS
    layers: int  # transformer layers
    kv_heads: int  # global KV heads (before TP)
    block_size: int  # tokens per block
    head_dim: int  # elements per head vector
    tp: int = 1  # tensor-parallel ranks, sharding heads
    cp: int = 1  # context-parallel ranks, sharding tokens

    def __post_init__(self) -> None:
        sm.check_layout(self.layout)
        for name in ("layers", "kv_heads", "block_size", "head_dim", "tp", "cp"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVLayout.{name}={getattr(self, name)} must be >= 1")
        sm.tp_check(self.kv_heads, self.tp)

    @property
    def local_dims(self) -> sm.BlockDims:
        heads = sm.tp_local_heads(self.kv_heads, self.tp)
        return sm.BlockDims(self.layers, heads, self.block_size, self.head_dim)

    def pool_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (num_blocks, *sm.block_shape(self.layout, self.local_dims))

    def to_manifest(self) -> dict[str, int | str]:
        return {
            "layout": self.layout,
            "layers": self.layers,
            "kv_heads": self.kv_heads,
            "block_size": self.block_size,
            "head_dim": self.head_dim,
            "tp": self.tp,
            "cp": self.cp,
        }

    @classmethod
    def from_manifest(cls, d: dict[str, int | str]) -> KVLayout:
        return cls(
            layout=str(d["layout"]),
            **{k: int(d[k]) for k in ("layers", "kv_heads", "block_size", "head_dim", "tp", "cp")},
        )


@dataclass
class ShardedKV:
    """One side's paged KV for one request: pools[tp][cp] and a block table per CP rank."""

    decl: KVLayout
    pools: list[list[torch.Tensor]]  # [tp_rank][cp_rank] -> (num_blocks, *block_shape)
    block_tables: list[list[int]]  # [cp_rank] -> physical block of each logical block
    num_tokens: int = 0  # tokens [0, num_tokens) of the request are present
    checked: bool = field(default=False, repr=False)

    def check(self) -> None:
        """Raise ValueError if the present tensors disagree with the declared layout."""
        d = self.decl
        if len(self.pools) != d.tp or any(len(row) != d.cp for row in self.pools):
            got = [len(row) for row in self.pools]
            raise ValueError(f"declared tp={d.tp}, cp={d.cp} but pools has cp rows {got}")
        if len(self.block_tables) != d.cp:
            raise ValueError(f"declared cp={d.cp} but {len(self.block_tables)} block tables")
        dtype = self.pools[0][0].dtype
        for t, row in enumerate(self.pools):
            for c, pool in enumerate(row):
                check_pool(d, pool, f"pool[tp={t}][cp={c}]")
                if pool.dtype != dtype:
                    raise ValueError(f"pool[tp={t}][cp={c}] is {pool.dtype}, pool[0][0] {dtype}")
        for c, table in enumerate(self.block_tables):
            start, end = sm.cp_tokens(self.num_tokens, d.cp, c)
            need = sm.blocks_needed(end - start, d.block_size)
            if len(table) < need:
                raise ValueError(
                    f"block table of cp rank {c} has {len(table)} blocks, needs {need} "
                    f"for {end - start} tokens at block_size={d.block_size}"
                )
        self.checked = True


def check_pool(decl: KVLayout, pool: torch.Tensor, where: str = "pool") -> None:
    """Raise ValueError unless `pool` has the shape `decl` implies and is contiguous."""
    dims = decl.local_dims
    want = sm.block_shape(decl.layout, dims)
    got = tuple(pool.shape[1:])
    if pool.dim() != 6 or got != want:
        named = ", ".join(f"{a}={n}" for a, n in zip(sm.axis_order(decl.layout), want, strict=True))
        hint = ""
        for other in sm.LAYOUTS:
            if other != decl.layout and got == sm.block_shape(other, dims):
                hint = f"; it matches {other!r}: declare the layout the buffer really has"
        raise ValueError(
            f"{where} has block shape {got} but the declared layout {decl.layout!r} "
            f"({named}) expects {want}{hint}"
        )
    if not pool.is_contiguous():
        raise ValueError(f"{where} is not contiguous; a permuted view hides its real axis order")


@dataclass(frozen=True, slots=True)
class ReshardStats:
    copies: int  # copy_ calls issued
    bytes_moved: int  # bytes written on the destination side
    blocks_written: int  # distinct (tp rank, cp rank, physical block) destinations


def allocate(
    decl: KVLayout,
    num_tokens: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    spare_blocks: int = 0,
) -> ShardedKV:
    """Zeroed pools with contiguous block tables sized for `num_tokens` tokens."""
    tables = []
    for c in range(decl.cp):
        start, end = sm.cp_tokens(num_tokens, decl.cp, c)
        tables.append(list(range(sm.blocks_needed(end - start, decl.block_size) + spare_blocks)))
    pools = [
        [
            torch.zeros(decl.pool_shape(max(1, len(tables[c]))), dtype=dtype, device=device)
            for c in range(decl.cp)
        ]
        for _ in range(decl.tp)
    ]
    return ShardedKV(decl, pools, tables, 0)


def _region(
    pool: torch.Tensor, layout: str, blocks: slice, layers: slice, heads: slice, slots: slice
) -> torch.Tensor:
    """A view of pool[blocks] restricted per named axis; result axes follow `layout`."""
    per_axis = {"layer": layers, "kv": ALL, "head": heads, "slot": slots, "dim": ALL}
    return pool[(blocks, *(per_axis[a] for a in sm.axis_order(layout)))]


@dataclass(frozen=True, slots=True)
class _Span:
    """Physical blocks [src, src+n) -> [dst, dst+n), slots [s0, s0+len) -> [d0, d0+len)."""

    src: int
    dst: int
    n: int
    src_slot: int
    dst_slot: int
    length: int


def _spans(
    pieces: list[sm.SlotPiece],
    src_table: list[int],
    dst_table: list[int],
    src_bs: int,
    dst_bs: int,
) -> list[_Span]:
    """Map logical slot pieces to physical spans, merging runs of whole adjacent blocks."""
    spans: list[_Span] = []
    for p in pieces:
        s, d = src_table[p.src_block], dst_table[p.dst_block]
        whole = p.src_slot == 0 and p.dst_slot == 0 and p.length == src_bs == dst_bs
        if whole and spans:
            last = spans[-1]
            if last.length == p.length and last.src + last.n == s and last.dst + last.n == d:
                spans[-1] = _Span(last.src, last.dst, last.n + 1, 0, 0, p.length)
                continue
        spans.append(_Span(s, d, 1, p.src_slot, p.dst_slot, p.length))
    return spans


def _copy(
    src: torch.Tensor,
    src_layout: str,
    dst: torch.Tensor,
    dst_layout: str,
    spans: list[_Span],
    heads: tuple[slice, slice],
    layers: tuple[slice, slice] = (ALL, ALL),
) -> int:
    """Issue one copy_ per span; returns bytes written."""
    perm = (0, *(p + 1 for p in sm.layout_permutation(src_layout, dst_layout)))
    moved = 0
    for sp in spans:
        a = _region(
            src,
            src_layout,
            slice(sp.src, sp.src + sp.n),
            layers[0],
            heads[0],
            slice(sp.src_slot, sp.src_slot + sp.length),
        )
        b = _region(
            dst,
            dst_layout,
            slice(sp.dst, sp.dst + sp.n),
            layers[1],
            heads[1],
            slice(sp.dst_slot, sp.dst_slot + sp.length),
        )
        b.copy_(a.permute(perm))
        moved += b.numel() * b.element_size()
    return moved


def _same_model(a: KVLayout, b: KVLayout) -> None:
    for name in ("layers", "kv_heads", "head_dim"):
        if getattr(a, name) != getattr(b, name):
            raise ValueError(f"cannot reshard: {name} {getattr(a, name)} != {getattr(b, name)}")


def reshard(
    src: ShardedKV, dst: ShardedKV, start: int = 0, stop: int | None = None
) -> ReshardStats:
    """Copy tokens [start, stop) (default: all of src) of every layer, K and V, into dst.

    `start` > 0 sends only a suffix (the destination already holds the prefix).  The
    destination's block tables must already cover src.num_tokens tokens.
    """
    _same_model(src.decl, dst.decl)
    if dst.decl.cp > 1 and dst.num_tokens not in (0, src.num_tokens):
        raise ValueError(
            f"dst cp={dst.decl.cp} is sharded for {dst.num_tokens} tokens, src has "
            f"{src.num_tokens}: CP shards would not line up"
        )
    src.check()
    before = dst.num_tokens  # a refused reshard leaves dst as it was
    dst.num_tokens = max(before, src.num_tokens)
    try:
        dst.check()
        if src.pools[0][0].dtype != dst.pools[0][0].dtype:
            raise ValueError(f"dtype {src.pools[0][0].dtype} != {dst.pools[0][0].dtype}")
    except ValueError:
        dst.num_tokens = before
        raise
    s, d, total = src.decl, dst.decl, src.num_tokens
    copies = moved = 0
    written: set[tuple[int, int, int]] = set()
    head_plan = sm.tp_reshard_plan(s.kv_heads, s.tp, d.tp)
    for tok in sm.cp_reshard_plan(total, s.cp, d.cp):
        s0 = sm.cp_tokens(total, s.cp, tok.src_rank)[0]
        lo = max(start, s0 + tok.src_start)  # global first token of this piece to send
        hi = min(total if stop is None else stop, s0 + tok.src_start + tok.length)
        n = hi - lo
        if n <= 0:
            continue
        runs = sm.token_copy_plan(
            lo - s0, tok.dst_start + lo - s0 - tok.src_start, n, s.block_size, d.block_size
        )
        src_table, dst_table = src.block_tables[tok.src_rank], dst.block_tables[tok.dst_rank]
        spans = _spans(runs, src_table, dst_table, s.block_size, d.block_size)
        for hp in head_plan:
            moved += _copy(
                src.pools[hp.src_rank][tok.src_rank],
                s.layout,
                dst.pools[hp.dst_rank][tok.dst_rank],
                d.layout,
                spans,
                (hp.src_slice, hp.dst_slice),
            )
            copies += len(spans)
            written.update((hp.dst_rank, tok.dst_rank, dst_table[r.dst_block]) for r in runs)
    return ReshardStats(copies, moved, len(written))


def _flat(full: torch.Tensor, num_tokens: int) -> ShardedKV:
    """View an unsharded (layers, 2, kv_heads, T, head_dim) tensor as one TP=1 CP=1 block."""
    layers, _, heads, cap, dim = full.shape
    decl = KVLayout("heads_major", layers, heads, max(cap, 1), dim)
    return ShardedKV(decl, [[full.unsqueeze(0)]], [[0]], num_tokens)


def shard(full: torch.Tensor, decl: KVLayout, spare_blocks: int = 0) -> ShardedKV:
    """Split an unsharded (layers, 2, kv_heads, T, head_dim) tensor into `decl`'s pools."""
    kv = allocate(
        decl, full.shape[3], dtype=full.dtype, device=full.device, spare_blocks=spare_blocks
    )
    if full.shape[3] == 0:
        return kv
    reshard(_flat(full.contiguous(), full.shape[3]), kv)
    return kv


def unshard(kv: ShardedKV) -> torch.Tensor:
    """The (layers, 2, kv_heads, T, head_dim) tensor held by kv (primary replicas read)."""
    d = kv.decl
    full = torch.empty(
        (d.layers, 2, d.kv_heads, kv.num_tokens, d.head_dim),
        dtype=kv.pools[0][0].dtype,
        device=kv.pools[0][0].device,
    )
    if kv.num_tokens:
        reshard(kv, _flat(full, 0))
    return full


def write_tokens(kv: ShardedKV, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write k, v (kv_heads, T, head_dim) of one layer as global tokens [start, start+T).

    Every replica of every head is written; kv.num_tokens grows to start+T.
    """
    d, n = kv.decl, k.shape[1]
    if d.cp > 1 and 0 < kv.num_tokens < start + n:
        raise ValueError(
            f"cp={d.cp}: CP shards are fixed by the prefill length {kv.num_tokens}; "
            f"tokens up to {start + n} cannot be appended"
        )
    kv.num_tokens = max(kv.num_tokens, start + n)
    if not kv.checked:
        kv.check()
    src = torch.stack((k, v)).unsqueeze(0).unsqueeze(0)  # (1, 1, 2, H, T, hs)
    for c in range(d.cp):
        c0, c1 = sm.cp_tokens(kv.num_tokens, d.cp, c)
        lo, hi = max(c0, start), min(c1, start + n)
        if lo >= hi:
            continue
        runs = sm.token_copy_plan(lo - start, lo - c0, hi - lo, max(n, 1), d.block_size)
        if len(kv.block_tables[c]) < sm.blocks_needed(c1 - c0, d.block_size):
            raise ValueError(f"block table of cp rank {c} is too short for {c1 - c0} tokens")
        spans = _spans(runs, [0], kv.block_tables[c], max(n, 1), d.block_size)
        for t in range(d.tp):
            heads = sm.tp_heads(d.kv_heads, d.tp, t)
            _copy(
                src,
                "heads_major",
                kv.pools[t][c],
                d.layout,
                spans,
                (slice(heads.start, heads.stop), ALL),
                (ALL, slice(layer, layer + 1)),
            )


def read_tokens(kv: ShardedKV, tp_rank: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one layer held by one TP rank: each (kv_heads_local, T, head_dim), contiguous."""
    d, total = kv.decl, kv.num_tokens
    pool = kv.pools[tp_rank][0]
    out = torch.empty(
        (1, 1, 2, d.local_dims.kv_heads, total, d.head_dim), dtype=pool.dtype, device=pool.device
    )  # (1, 1, 2, h, T, hs)
    for c in range(d.cp):
        c0, c1 = sm.cp_tokens(total, d.cp, c)
        runs = sm.token_copy_plan(0, c0, c1 - c0, d.block_size, max(total, 1))
        spans = _spans(runs, kv.block_tables[c], [0], d.block_size, max(total, 1))
        _copy(
            kv.pools[tp_rank][c],
            d.layout,
            out,
            "heads_major",
            spans,
            (ALL, ALL),
            (slice(layer, layer + 1), ALL),
        )
    return out[0, 0, 0], out[0, 0, 1]
