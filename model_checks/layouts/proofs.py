"""Layout proofs: the shard maps of spec/shardmap.py are bijections (z3).

System.  A reshard plan moves every KV element (layer, kv, head, token) from one split
(TP heads, CP tokens, block size, axis order) to another.

Properties, each checked as "the negation is unsat" (one solver query per instance; on
sat the model is printed as a readable counterexample naming the law it broke):
    write-once   every destination element is written by exactly one piece
    read-once    every element of a primary source replica is read by exactly one primary
                 piece, and non-primary replicas are never read
    content      each piece lands the element it read (same global head / token / index)
    well-formed  no piece reads or writes outside its rank's shard or block

Model.  Plans are the spec's own output (`tp_reshard_plan`, `cp_reshard_plan`,
`block_size_plan`), enumerated over a finite parameter grid and encoded as linear integer
constraints over a symbolic element.  The axis-order claim is fully symbolic: z3 evaluates
`spec.shardmap.flat_index` itself on integer terms, for *all* dimension sizes.

Harness.  `layout_claims(quick)` returns one `LayoutClaim` per id; `python -m
model_checks.layouts.proofs` prints them.  `layout:bug:incident3` is expected "violated".
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import z3

from model_checks.layouts.axis import axis_order_claim, incident3_claim
from model_checks.layouts.common import (
    Instance,
    LayoutClaim,
    Z,
    at_index,
    between,
    check_instances,
    in_run,
    lookup,
    misplaced,
    not_once,
)
from spec import shardmap as sm

# ---------------------------------------------------------------------------------------
# TP: (rank, local head) slots; pieces span every layer, K/V and token.


def _tp_instance(kv: int, src_tp: int, dst_tp: int) -> Instance:
    plan = sm.tp_reshard_plan(kv, src_tp, dst_tp)
    hs, hd = sm.tp_local_heads(kv, src_tp), sm.tp_local_heads(kv, dst_tp)
    gsrc = [sm.tp_heads(kv, src_tp, r) for r in range(src_tp)]  # ranges of global heads
    gdst = [sm.tp_heads(kv, dst_tp, r) for r in range(dst_tp)]
    r, s, j, x = z3.Ints("dst_rank src_rank head_slot offset")
    prim_s = z3.Or([s == q for q in range(src_tp) if sm.tp_is_primary(kv, src_tp, q)])

    def reads(p: sm.HeadPiece) -> Z:
        return z3.And(s == p.src_rank, between(p.src_start, j, p.src_stop))

    def moved(p: sm.HeadPiece) -> tuple[int, Z, Z]:
        src, dst = (
            at_index(gsrc[p.src_rank], p.src_start + x),
            at_index(gdst[p.dst_rank], p.dst_start + x),
        )
        return p.dst_stop - p.dst_start, src, dst

    writes = [z3.And(r == p.dst_rank, between(p.dst_start, j, p.dst_stop)) for p in plan]
    primary_reads = [reads(p) for p in plan if p.primary]
    laws = {
        "write-once": z3.And(between(0, r, dst_tp), between(0, j, hd), not_once(writes)),
        "read-once": z3.And(
            between(0, s, src_tp),
            between(0, j, hs),
            z3.Or(
                z3.And(prim_s, not_once(primary_reads)),
                z3.And(z3.Not(prim_s), z3.Or(z3.BoolVal(False), *[reads(p) for p in plan])),
            ),
        ),
        "content": misplaced(x, [moved(p) for p in plan]),
        "well-formed": z3.BoolVal(
            any(
                p.src_stop - p.src_start != p.dst_stop - p.dst_start
                or not (0 <= p.src_start < p.src_stop <= hs and 0 <= p.dst_start < p.dst_stop <= hd)
                or p.primary != sm.tp_is_primary(kv, dst_tp, p.dst_rank)
                for p in plan
            )
        ),
    }

    def render(m: Any) -> str:
        return (
            f"kv_heads={kv}: dst slot (rank {m.eval(r, True)}, head {m.eval(j, True)}), "
            f"src slot (rank {m.eval(s, True)}, head {m.eval(j, True)}), offset {m.eval(x, True)}"
        )

    return f"kv_heads={kv} tp {src_tp}->{dst_tp}", z3.BoolVal(True), laws, render


def _tp_valid(kv: int, tp: int) -> bool:
    return kv % tp == 0 or (kv < tp and tp % kv == 0)


def _kv_grid(src_tp: int, dst_tp: int) -> list[int]:
    """Every head count valid for both sides up to max(tp), then lcm and 2*lcm.

    A valid kv_heads above max(tp) is a multiple of lcm(src_tp, dst_tp); its plan is the
    plan for lcm with every piece widened, so lcm and 2*lcm stand for all of them.
    """
    lcm = math.lcm(src_tp, dst_tp)
    small = range(1, max(src_tp, dst_tp) + 1)
    both = [kv for kv in small if _tp_valid(kv, src_tp) and _tp_valid(kv, dst_tp)]
    return sorted({*both, lcm, 2 * lcm})


def tp_claim(src_tp: int, dst_tp: int, kv_grid: Sequence[int] | None = None) -> LayoutClaim:
    grid = _kv_grid(src_tp, dst_tp) if kv_grid is None else kv_grid
    kvs = [kv for kv in grid if _tp_valid(kv, src_tp) and _tp_valid(kv, dst_tp)]
    made = [partial(_tp_instance, kv, src_tp, dst_tp) for kv in kvs]
    covered = f"kv_heads in {kvs}; pieces span all layers, K/V and tokens"
    return check_instances(f"layout:tp:{src_tp}->{dst_tp}", made, covered)


# ---------------------------------------------------------------------------------------
# CP: (rank, local token) slots; pieces span every layer, K/V and head.


def _cp_instance(num_tokens: int, src_cp: int, dst_cp: int) -> Instance:
    plan = sm.cp_reshard_plan(num_tokens, src_cp, dst_cp)
    src_sh = [sm.cp_tokens(num_tokens, src_cp, q) for q in range(src_cp)]
    dst_sh = [sm.cp_tokens(num_tokens, dst_cp, q) for q in range(dst_cp)]
    r, s, p_, t, x = z3.Ints("dst_rank src_rank pos token offset")

    def moved(q: sm.TokenPiece) -> tuple[int, Z, Z]:  # global tokens read and written
        read, written = src_sh[q.src_rank][0] + q.src_start, dst_sh[q.dst_rank][0] + q.dst_start
        return q.length, read + x, written + x

    def length(shards: list[tuple[int, int]], rank: Z) -> Z:
        return lookup([b - a for a, b in shards], rank)

    writes = [in_run(r, q.dst_rank, p_, q.dst_start, q.length) for q in plan]
    reads = [in_run(s, q.src_rank, p_, q.src_start, q.length) for q in plan]
    laws = {
        "shards-partition": z3.And(
            between(0, t, num_tokens),
            z3.Or(
                not_once([between(a, t, b) for a, b in src_sh]),
                not_once([between(a, t, b) for a, b in dst_sh]),
            ),
        ),
        "write-once": z3.And(
            between(0, r, dst_cp), 0 <= p_, p_ < length(dst_sh, r), not_once(writes)
        ),
        "read-once": z3.And(
            between(0, s, src_cp), 0 <= p_, p_ < length(src_sh, s), not_once(reads)
        ),
        "content": misplaced(x, [moved(q) for q in plan]),
    }

    def render(m: Any) -> str:
        return (
            f"T={num_tokens}: token {m.eval(t, True)}, dst (rank {m.eval(r, True)}, pos "
            f"{m.eval(p_, True)}), src (rank {m.eval(s, True)}, pos {m.eval(p_, True)})"
        )

    return f"T={num_tokens} cp {src_cp}->{dst_cp}", z3.BoolVal(True), laws, render


def _cp_token_grid(src_cp: int, dst_cp: int) -> list[int]:
    """Token counts covering empty, short and uneven shards on either side."""
    prod = src_cp * dst_cp
    small = range(2 * max(src_cp, dst_cp) + 2)
    return sorted({*small, prod - 1, prod, prod + 1, 3 * prod + 1})


def cp_claim(src_cp: int, dst_cps: Sequence[int]) -> LayoutClaim:
    grid = {d: _cp_token_grid(src_cp, d) for d in dst_cps}
    made = [partial(_cp_instance, n, src_cp, d) for d in dst_cps for n in grid[d]]
    top = max(max(g) for g in grid.values())
    covered = f"to cp in {list(dst_cps)}, num_tokens up to {top} (uneven shards)"
    return check_instances(f"layout:cp:{src_cp}", made, covered)


# ---------------------------------------------------------------------------------------
# Block size: token t lives at (t // bs, t % bs) on both sides.


def _block_instance(num_tokens: int, src_bs: int, dst_bs: int) -> Instance:
    plan = sm.block_size_plan(num_tokens, src_bs, dst_bs)
    b, sl, x = z3.Ints("block slot offset")

    def moved(p: sm.SlotPiece) -> tuple[int, Z, Z]:  # token positions read and written
        read, written = p.src_block * src_bs + p.src_slot, p.dst_block * dst_bs + p.dst_slot
        return p.length, read + x, written + x

    writes = [in_run(b, p.dst_block, sl, p.dst_slot, p.length) for p in plan]
    reads = [in_run(b, p.src_block, sl, p.src_slot, p.length) for p in plan]
    laws = {
        "write-once": z3.And(
            b >= 0, between(0, sl, dst_bs), b * dst_bs + sl < num_tokens, not_once(writes)
        ),
        "read-once": z3.And(
            b >= 0, between(0, sl, src_bs), b * src_bs + sl < num_tokens, not_once(reads)
        ),
        "content": misplaced(x, [moved(p) for p in plan]),
        "well-formed": z3.BoolVal(
            any(p.src_slot + p.length > src_bs or p.dst_slot + p.length > dst_bs for p in plan)
        ),
    }

    def render(m: Any) -> str:
        return f"T={num_tokens}: (block {m.eval(b, True)}, slot {m.eval(sl, True)})"

    return f"T={num_tokens} bs {src_bs}->{dst_bs}", z3.BoolVal(True), laws, render


def _token_grid(src_bs: int, dst_bs: int) -> list[int]:
    """Token counts that hit every alignment case: empty, short, aligned, ragged tails."""
    lcm = math.lcm(src_bs, dst_bs)
    near = {0, 1, 2, src_bs, dst_bs, lcm, lcm + src_bs + dst_bs, 2 * lcm}
    return sorted({n + e for n in near for e in (-1, 0, 1) if n + e >= 0})


def block_size_claim(src_bs: int, dst_bs: int) -> LayoutClaim:
    grid = _token_grid(src_bs, dst_bs)
    made = [partial(_block_instance, n, src_bs, dst_bs) for n in grid]
    return check_instances(f"layout:block_size:{src_bs}->{dst_bs}", made, f"num_tokens in {grid}")


# ---------------------------------------------------------------------------------------
# Harness


def layout_claims(quick: bool = False) -> list[LayoutClaim]:
    """Every layout claim; quick=True runs a smaller grid (for the test suite)."""
    tps = [1, 2, 4, 8] if quick else list(range(1, 17))
    cps = [1, 2, 4] if quick else list(range(1, 9))
    sizes = [4, 8, 16] if quick else [1, 2, 3, 4, 8, 12, 16, 32]
    claims = [tp_claim(a, b) for a in tps for b in tps]
    claims += [cp_claim(c, cps) for c in cps]
    claims += [block_size_claim(s, d) for s in sizes for d in sizes if s != d]
    claims += [axis_order_claim(), incident3_claim()]
    return claims


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    claims = layout_claims(quick="--quick" in args)
    for c in claims:
        print(f"{c.id:32} {c.method:10} {c.result:9} {c.seconds:7.3f}s  {c.detail}")
    print(f"{len(claims)} claims in {time.perf_counter() - t0:.2f}s")
    expected = {c.id: ("violated" if c.id.startswith("layout:bug:") else "proved") for c in claims}
    return 0 if all(c.result == expected[c.id] for c in claims) else 1


if __name__ == "__main__":
    raise SystemExit(main())
