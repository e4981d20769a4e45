"""Shard maps: where each KV element lives under TP, CP, block size and axis order.

System.  A request's KV cache is a 4-d set of elements (layer, kv, head, token), each a
`head_dim` vector.  Workers split it along heads (tensor parallel, TP), along tokens
(context parallel, CP) and page the tokens into fixed-size blocks whose inner axis order
(the layout) is an engine choice.  Resharding moves the elements from one split to another.

Assumptions.  Pure integer math: no torch, networkx or z3.  The refimpl (refimpl/reshard.py)
and the layout proofs (model_checks/layouts/proofs.py) both call these functions; neither
restates them.

Ownership intervals (H = kv_heads, P = tp):

    P divides H          rank r owns heads [r*H/P, (r+1)*H/P); one replica per head
    H < P, H divides P   rank r owns head r // (P/H); P/H replicas per head, the lowest
                         rank of a head's replica group is its *primary*
    otherwise            refused (ValueError)

    CP over T tokens     rank r owns tokens [r*c, min((r+1)*c, T)), c = ceil(T/cp); the last
                         non-empty shard may be short, and trailing ranks may be empty
    block size bs        token t lives in logical block t // bs, slot t % bs

Properties (proved in model_checks/layouts/proofs.py, tested in tests/test_shardmap.py):
    safety  every destination element is written exactly once by a reshard plan
    safety  every source element of a primary replica is read exactly once by a primary
            piece; non-primary replicas are never read
    safety  every piece lands the same (layer, kv, head, token) that it read
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# ---------------------------------------------------------------------------------------
# TP: shard by KV heads


def tp_check(kv_heads: int, tp: int) -> None:
    """Raise ValueError unless `tp` can shard `kv_heads` (divides it, or is a multiple)."""
    if kv_heads < 1 or tp < 1:
        raise ValueError(f"kv_heads={kv_heads} and tp={tp} must both be >= 1")
    if kv_heads % tp == 0:
        return
    if kv_heads < tp and tp % kv_heads == 0:
        return
    if kv_heads < tp:
        raise ValueError(
            f"kv_heads={kv_heads} does not divide tp={tp}: heads cannot be replicated evenly"
        )
    raise ValueError(
        f"tp={tp} does not divide kv_heads={kv_heads} and kv_heads is not smaller than tp"
    )


def tp_local_heads(kv_heads: int, tp: int) -> int:
    """KV heads held by each TP rank (1 when heads are replicated)."""
    tp_check(kv_heads, tp)
    return max(1, kv_heads // tp)


def tp_replicas(kv_heads: int, tp: int) -> int:
    """How many TP ranks hold each KV head (1 unless kv_heads < tp)."""
    tp_check(kv_heads, tp)
    return max(1, tp // kv_heads)


def _check_rank(rank: int, size: int, what: str) -> None:
    if not 0 <= rank < size:
        raise ValueError(f"{what} rank={rank} is outside [0, {size})")


def tp_heads(kv_heads: int, tp: int, rank: int) -> range:
    """The global KV heads that TP rank `rank` holds, in local-slot order."""
    per, reps = tp_local_heads(kv_heads, tp), tp_replicas(kv_heads, tp)
    _check_rank(rank, tp, "tp")
    first = (rank // reps) * per
    return range(first, first + per)


def tp_owner(kv_heads: int, tp: int, head: int) -> range:
    """The TP ranks that hold global KV `head`; the first one is the primary."""
    per, reps = tp_local_heads(kv_heads, tp), tp_replicas(kv_heads, tp)
    if not 0 <= head < kv_heads:
        raise ValueError(f"head={head} is outside [0, kv_heads={kv_heads})")
    first = (head // per) * reps
    return range(first, first + reps)


def tp_primary(kv_heads: int, tp: int, head: int) -> int:
    """The replica of `head` that a reshard reads from (and writes first)."""
    return tp_owner(kv_heads, tp, head)[0]


def tp_is_primary(kv_heads: int, tp: int, rank: int) -> bool:
    """Whether `rank` is the primary replica of every head it holds."""
    _check_rank(rank, tp, "tp")
    return rank % tp_replicas(kv_heads, tp) == 0


def tp_q_heads(q_heads: int, kv_heads: int, tp: int, rank: int) -> range:
    """The query heads TP rank `rank` computes; their KV heads (GQA) are all local."""
    if q_heads % kv_heads != 0 or q_heads % tp != 0:
        raise ValueError(f"q_heads={q_heads} must be a multiple of kv_heads={kv_heads} and tp={tp}")
    tp_check(kv_heads, tp)
    _check_rank(rank, tp, "tp")
    per = q_heads // tp
    return range(rank * per, (rank + 1) * per)


@dataclass(frozen=True, slots=True)
class HeadPiece:
    """Copy local heads [src_start, src_stop) of src_rank to [dst_start, dst_stop) of dst_rank.

    A piece spans every layer, both K and V, and every token of the request.
    """

    src_rank: int  # source TP rank (always a primary replica)
    src_start: int  # first local head slot read on src_rank
    src_stop: int  # one past the last local head slot read
    dst_rank: int  # destination TP rank
    dst_start: int  # first local head slot written on dst_rank
    dst_stop: int  # one past the last local head slot written
    primary: bool  # dst_rank is the primary replica of these heads

    @property
    def src_slice(self) -> slice:
        return slice(self.src_start, self.src_stop)

    @property
    def dst_slice(self) -> slice:
        return slice(self.dst_start, self.dst_stop)


def tp_reshard_plan(kv_heads: int, src_tp: int, dst_tp: int) -> list[HeadPiece]:
    """Pieces that fill every head slot of every destination rank exactly once.

    Each piece reads from the primary source replica only.  When the destination
    replicates heads, one primary piece per head writes its primary replica; the
    non-primary pieces (primary=False) are fan-out copies of the same source slot.
    """
    tp_check(kv_heads, src_tp)
    tp_check(kv_heads, dst_tp)
    pieces: list[HeadPiece] = []
    for dst in range(dst_tp):
        heads = tp_heads(kv_heads, dst_tp, dst)
        head = heads.start
        while head < heads.stop:
            src = tp_primary(kv_heads, src_tp, head)
            src_heads = tp_heads(kv_heads, src_tp, src)
            stop = min(src_heads.stop, heads.stop)
            pieces.append(
                HeadPiece(
                    src_rank=src,
                    src_start=head - src_heads.start,
                    src_stop=stop - src_heads.start,
                    dst_rank=dst,
                    dst_start=head - heads.start,
                    dst_stop=stop - heads.start,
                    primary=tp_is_primary(kv_heads, dst_tp, dst),
                )
            )
            head = stop
    return pieces


# ---------------------------------------------------------------------------------------
# CP: shard by token ranges


def cp_check(num_tokens: int, cp: int) -> None:
    if num_tokens < 0 or cp < 1:
        raise ValueError(f"num_tokens={num_tokens} must be >= 0 and cp={cp} must be >= 1")


def cp_tokens(num_tokens: int, cp: int, rank: int) -> tuple[int, int]:
    """Global token range [start, end) of CP rank `rank`; the last shard may be short."""
    cp_check(num_tokens, cp)
    _check_rank(rank, cp, "cp")
    chunk = -(-num_tokens // cp)
    start = min(rank * chunk, num_tokens)
    return start, min(start + chunk, num_tokens)


def cp_owner(num_tokens: int, cp: int, token: int) -> int:
    """The CP rank holding global `token`."""
    cp_check(num_tokens, cp)
    if not 0 <= token < num_tokens:
        raise ValueError(f"token={token} is outside [0, num_tokens={num_tokens})")
    return token // -(-num_tokens // cp)


@dataclass(frozen=True, slots=True)
class TokenPiece:
    """Copy `length` tokens from src_rank's local position src_start to dst_rank's dst_start."""

    src_rank: int  # source CP rank
    src_start: int  # first token, local to src_rank's shard
    dst_rank: int  # destination CP rank
    dst_start: int  # first token, local to dst_rank's shard
    length: int  # tokens copied (> 0)


def cp_reshard_plan(num_tokens: int, src_cp: int, dst_cp: int) -> list[TokenPiece]:
    """Pieces that move each of `num_tokens` tokens from its src_cp shard to its dst_cp one."""
    pieces: list[TokenPiece] = []
    for dst in range(dst_cp):
        d0, d1 = cp_tokens(num_tokens, dst_cp, dst)
        for src in range(src_cp):
            s0, s1 = cp_tokens(num_tokens, src_cp, src)
            lo, hi = max(s0, d0), min(s1, d1)
            if lo < hi:
                pieces.append(TokenPiece(src, lo - s0, dst, lo - d0, hi - lo))
    return pieces


# ---------------------------------------------------------------------------------------
# Block size: token t lives at (t // bs, t % bs)


def block_of(token: int, block_size: int) -> tuple[int, int]:
    """(logical block, slot) of `token` under `block_size`."""
    if block_size < 1 or token < 0:
        raise ValueError(f"block_size={block_size} must be >= 1 and token={token} >= 0")
    return token // block_size, token % block_size


def token_at(block: int, slot: int, block_size: int) -> int:
    if not 0 <= slot < block_size or block < 0:
        raise ValueError(f"slot={slot} is outside [0, block_size={block_size}) or block={block}<0")
    return block * block_size + slot


def convert_slot(block: int, slot: int, src_bs: int, dst_bs: int) -> tuple[int, int]:
    """Where (block, slot) under src_bs lands under dst_bs, preserving the token position."""
    return block_of(token_at(block, slot, src_bs), dst_bs)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class SlotPiece:
    """Copy `length` slots from (src_block, src_slot..) to (dst_block, dst_slot..).

    Neither side crosses a block boundary; blocks are logical (block-table indices).
    """

    src_block: int
    src_slot: int
    dst_block: int
    dst_slot: int
    length: int


def token_copy_plan(
    src_start: int, dst_start: int, length: int, src_bs: int, dst_bs: int
) -> list[SlotPiece]:
    """Runs mapping token src_start+i (paged by src_bs) to dst_start+i (paged by dst_bs)."""
    if min(src_start, dst_start, length) < 0:
        raise ValueError(f"src_start={src_start}, dst_start={dst_start}, length={length} < 0")
    pieces: list[SlotPiece] = []
    done = 0
    while done < length:
        sb, ss = block_of(src_start + done, src_bs)
        db, ds = block_of(dst_start + done, dst_bs)
        n = min(src_bs - ss, dst_bs - ds, length - done)
        pieces.append(SlotPiece(sb, ss, db, ds, n))
        done += n
    return pieces


def block_size_plan(num_tokens: int, src_bs: int, dst_bs: int) -> list[SlotPiece]:
    """Runs converting the first `num_tokens` tokens from block size src_bs to dst_bs."""
    return token_copy_plan(0, 0, num_tokens, src_bs, dst_bs)


# ---------------------------------------------------------------------------------------
# Axis order within a block

LAYOUTS = ("heads_major", "tokens_major")
INDEX_AXES = ("layer", "kv", "head", "slot", "dim")  # the canonical index order
_ORDERS = {
    "heads_major": ("layer", "kv", "head", "slot", "dim"),  # [L, 2, H, bs, D]
    "tokens_major": ("layer", "kv", "slot", "head", "dim"),  # [L, 2, bs, H, D]
}


class BlockDims(NamedTuple):
    """Sizes of one block's axes (kv, the K/V pair, is always 2)."""

    layers: int
    kv_heads: int
    block_size: int
    head_dim: int


def check_layout(layout: str) -> None:
    if layout not in _ORDERS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


def axis_order(layout: str) -> tuple[str, ...]:
    """Axis names of a block in memory order, outermost first."""
    check_layout(layout)
    return _ORDERS[layout]


def _axis_sizes(dims: BlockDims) -> dict[str, int]:
    return {
        "layer": dims.layers,
        "kv": 2,
        "head": dims.kv_heads,
        "slot": dims.block_size,
        "dim": dims.head_dim,
    }


def block_shape(layout: str, dims: BlockDims) -> tuple[int, ...]:
    sizes = _axis_sizes(dims)
    return tuple(sizes[axis] for axis in axis_order(layout))


def block_numel(dims: BlockDims) -> int:
    return dims.layers * 2 * dims.kv_heads * dims.block_size * dims.head_dim


def index_in_box(dims: BlockDims, idx: tuple[int, int, int, int, int]) -> bool:
    """Whether idx = (layer, kv, head, slot, dim) is inside one block."""
    sizes = _axis_sizes(dims)
    return all(0 <= i < sizes[axis] for axis, i in zip(INDEX_AXES, idx, strict=True))


def flat_index(layout: str, dims: BlockDims, idx: tuple[int, int, int, int, int]) -> int:
    """Row-major offset of idx = (layer, kv, head, slot, dim) inside a block of `layout`.

    Only + and * are used, so the layout proofs evaluate this very function on z3
    integer terms; bounds are the caller's (see `index_in_box`).
    """
    coord = dict(zip(INDEX_AXES, idx, strict=True))
    sizes = _axis_sizes(dims)
    offset = 0
    for axis in axis_order(layout):
        offset = offset * sizes[axis] + coord[axis]
    return offset


def layout_permutation(src: str, dst: str) -> tuple[int, ...]:
    """p with dst_block = src_block.permute(p): dst axis i is src axis p[i]."""
    src_order = axis_order(src)
    return tuple(src_order.index(axis) for axis in axis_order(dst))
