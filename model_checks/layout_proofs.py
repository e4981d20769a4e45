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
model_checks.layout_proofs` prints them.  `layout:bug:incident3` is expected "violated".
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import z3

from spec import shardmap as sm

Z = Any  # z3 terms are untyped (no stubs)


@dataclass(frozen=True)
class LayoutClaim:
    id: str  # "layout:tp:8->2", "layout:cp:4", "layout:block_size:16->8", ...
    method: str  # always "bijection"
    result: str  # "proved" | "violated" | "unknown"
    seconds: float  # wall time of building and solving every instance
    detail: str  # what was covered, or the counterexample


Instance = tuple[str, Z, dict[str, Z], Callable[[Any], str]]  # name, domain, laws, render


def _check(claim_id: str, instances: Sequence[Callable[[], Instance]], covered: str) -> LayoutClaim:
    r"""Prove each law of each instance: domain /\ violation must be unsat."""
    t0 = time.perf_counter()
    solver = z3.Solver()
    solver.set("timeout", 20000)
    for make in instances:
        name, domain, laws, render = make()
        for law, violation in laws.items():
            solver.push()
            solver.add(domain, violation)
            verdict = solver.check()
            model = solver.model() if verdict == z3.sat else None
            solver.pop()
            if verdict == z3.unsat:
                continue
            seconds = time.perf_counter() - t0
            if model is None:
                text = f"{name}: {law}: solver says {verdict}"
                return LayoutClaim(claim_id, "bijection", "unknown", seconds, text)
            text = f"{name}: {law} violated: {render(model)}"
            return LayoutClaim(claim_id, "bijection", "violated", seconds, text)
    seconds = time.perf_counter() - t0
    text = f"{len(instances)} instances: {covered}"
    return LayoutClaim(claim_id, "bijection", "proved", seconds, text)


def _not_once(conds: Sequence[Z]) -> Z:
    """Not exactly one of conds holds (a pseudo-Boolean constraint)."""
    return z3.Not(z3.PbEq([(c, 1) for c in conds], 1)) if conds else z3.BoolVal(True)


def _lookup(row: Sequence[int], i: Z) -> Z:
    """row[i] as a z3 term (-1 outside the row)."""
    out: Z = z3.IntVal(-1)
    for k, value in enumerate(row):
        out = z3.If(i == k, value, out)
    return out


def _at(heads: range, i: Z) -> Z:
    """heads[i] for a symbolic i, as Python's range defines it."""
    return heads.start + heads.step * i


def _between(lo: int, x: Z, hi: int) -> Z:
    return z3.And(lo <= x, x < hi)


def _run(key: Z, k: int, pos: Z, start: int, n: int) -> Z:
    """(key, pos) lies in the run of n slots from (k, start)."""
    return z3.And(key == k, _between(start, pos, start + n))


def _differ(a: Sequence[Z], b: Sequence[Z]) -> Z:
    return z3.Or([x != y for x, y in zip(a, b, strict=True)])


def _misplaced(x: Z, moves: Sequence[tuple[int, Z, Z]]) -> Z:
    """Some piece (length, where it reads, where it writes) moves offset x elsewhere."""
    return z3.Or(z3.BoolVal(False), *[z3.And(_between(0, x, n), a != b) for n, a, b in moves])


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
        return z3.And(s == p.src_rank, _between(p.src_start, j, p.src_stop))

    def moved(p: sm.HeadPiece) -> tuple[int, Z, Z]:
        src, dst = _at(gsrc[p.src_rank], p.src_start + x), _at(gdst[p.dst_rank], p.dst_start + x)
        return p.dst_stop - p.dst_start, src, dst

    writes = [z3.And(r == p.dst_rank, _between(p.dst_start, j, p.dst_stop)) for p in plan]
    primary_reads = [reads(p) for p in plan if p.primary]
    laws = {
        "write-once": z3.And(_between(0, r, dst_tp), _between(0, j, hd), _not_once(writes)),
        "read-once": z3.And(
            _between(0, s, src_tp),
            _between(0, j, hs),
            z3.Or(
                z3.And(prim_s, _not_once(primary_reads)),
                z3.And(z3.Not(prim_s), z3.Or(z3.BoolVal(False), *[reads(p) for p in plan])),
            ),
        ),
        "content": _misplaced(x, [moved(p) for p in plan]),
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
    return _check(f"layout:tp:{src_tp}->{dst_tp}", made, covered)


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
        return _lookup([b - a for a, b in shards], rank)

    writes = [_run(r, q.dst_rank, p_, q.dst_start, q.length) for q in plan]
    reads = [_run(s, q.src_rank, p_, q.src_start, q.length) for q in plan]
    laws = {
        "shards-partition": z3.And(
            _between(0, t, num_tokens),
            z3.Or(
                _not_once([_between(a, t, b) for a, b in src_sh]),
                _not_once([_between(a, t, b) for a, b in dst_sh]),
            ),
        ),
        "write-once": z3.And(
            _between(0, r, dst_cp), 0 <= p_, p_ < length(dst_sh, r), _not_once(writes)
        ),
        "read-once": z3.And(
            _between(0, s, src_cp), 0 <= p_, p_ < length(src_sh, s), _not_once(reads)
        ),
        "content": _misplaced(x, [moved(q) for q in plan]),
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
    return _check(f"layout:cp:{src_cp}", made, covered)


# ---------------------------------------------------------------------------------------
# Block size: token t lives at (t // bs, t % bs) on both sides.


def _block_instance(num_tokens: int, src_bs: int, dst_bs: int) -> Instance:
    plan = sm.block_size_plan(num_tokens, src_bs, dst_bs)
    b, sl, x = z3.Ints("block slot offset")

    def moved(p: sm.SlotPiece) -> tuple[int, Z, Z]:  # token positions read and written
        read, written = p.src_block * src_bs + p.src_slot, p.dst_block * dst_bs + p.dst_slot
        return p.length, read + x, written + x

    writes = [_run(b, p.dst_block, sl, p.dst_slot, p.length) for p in plan]
    reads = [_run(b, p.src_block, sl, p.src_slot, p.length) for p in plan]
    laws = {
        "write-once": z3.And(
            b >= 0, _between(0, sl, dst_bs), b * dst_bs + sl < num_tokens, _not_once(writes)
        ),
        "read-once": z3.And(
            b >= 0, _between(0, sl, src_bs), b * src_bs + sl < num_tokens, _not_once(reads)
        ),
        "content": _misplaced(x, [moved(p) for p in plan]),
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
    return _check(f"layout:block_size:{src_bs}->{dst_bs}", made, f"num_tokens in {grid}")


# ---------------------------------------------------------------------------------------
# Axis order: symbolic dims, spec.shardmap.flat_index evaluated on z3 terms.


def _sym_dims() -> tuple[sm.BlockDims, Z]:
    layers, heads, bs, hd = z3.Ints("layers kv_heads block_size head_dim")
    dims = sm.BlockDims(layers, heads, bs, hd)
    return dims, z3.And(layers >= 1, heads >= 1, bs >= 1, hd >= 1)


def _sizes(dims: sm.BlockDims) -> tuple[Z, ...]:
    return (dims.layers, 2, dims.kv_heads, dims.block_size, dims.head_dim)  # INDEX_AXES order


def _in_box(dims: sm.BlockDims, idx: Sequence[Z]) -> Z:
    return z3.And([z3.And(0 <= i, i < n) for i, n in zip(idx, _sizes(dims), strict=True)])


def _row_major(shape: Sequence[Z], coords: Sequence[Z]) -> Z:
    """Offset of coords in a contiguous tensor of `shape` (torch's memory order)."""
    off: Z = z3.IntVal(0)
    for n, c in zip(shape, coords, strict=True):
        off = off * n + c
    return off


def _axis_instance(src: str, dst: str) -> Instance:
    dims, positive = _sym_dims()
    a = z3.Ints("layer kv head slot dim")
    b = z3.Ints("layer2 kv2 head2 slot2 dim2")
    n = z3.Int("offset")
    numel = sm.block_numel(dims)
    fa, fb = sm.flat_index(src, dims, tuple(a)), sm.flat_index(src, dims, tuple(b))
    # onto: every offset's digits (in src's axis order) are an index that maps back to it
    sizes = dict(zip(sm.INDEX_AXES, _sizes(dims), strict=True))
    digits: dict[str, Z] = {}
    rest: Z = n
    for axis in reversed(sm.axis_order(src)):
        digits[axis], rest = rest % sizes[axis], rest / sizes[axis]
    onto_idx = tuple(digits[axis] for axis in sm.INDEX_AXES)
    # conversion: dst = src.permute(p), made contiguous; where does index a land?
    perm = sm.layout_permutation(src, dst)
    src_coords = [dict(zip(sm.INDEX_AXES, a, strict=True))[ax] for ax in sm.axis_order(src)]
    src_shape = sm.block_shape(src, dims)
    landed = _row_major([src_shape[q] for q in perm], [src_coords[q] for q in perm])
    laws = {
        "injective": z3.And(
            _in_box(dims, a),
            _in_box(dims, b),
            fa == fb,
            _differ(a, b),
        ),
        "in-range": z3.And(_in_box(dims, a), z3.Or(fa < 0, fa >= numel)),
        "onto": z3.And(
            _between(0, n, numel),
            z3.Or(z3.Not(_in_box(dims, onto_idx)), sm.flat_index(src, dims, onto_idx) != n),
        ),
        "permute-agrees": z3.And(_in_box(dims, a), landed != sm.flat_index(dst, dims, tuple(a))),
    }

    def render(m: Any) -> str:
        return f"dims {[m.eval(d, True) for d in dims]}, index {[m.eval(i, True) for i in a]}"

    return f"{src}->{dst}", positive, laws, render


def axis_order_claim() -> LayoutClaim:
    pairs = [(s, d) for s in sm.LAYOUTS for d in sm.LAYOUTS]
    covered = "all positive dims (symbolic): flat_index is a bijection; permute agrees"
    return _check("layout:axis_order", [partial(_axis_instance, s, d) for s, d in pairs], covered)


def _incident3_instance() -> Instance:
    """TensorRT-LLM #6507: a tokens_major buffer sliced as if heads_major."""
    dims, positive = _sym_dims()
    a = z3.Ints("layer kv head slot dim")
    held = z3.Ints("layer' kv' head' slot' dim'")
    read_at = sm.flat_index("heads_major", dims, tuple(a))  # the buggy reader's offset
    laws = {
        "content": z3.And(
            _in_box(dims, a),
            _in_box(dims, held),
            read_at == sm.flat_index("tokens_major", dims, tuple(held)),
            _differ(a, held),
        )
    }
    small = z3.And(dims.layers == 1, dims.head_dim == 1, dims.kv_heads <= 2, dims.block_size <= 2)

    def render(m: Any) -> str:
        def show(idx: Sequence[Z]) -> str:
            v = [m.eval(i, True) for i in idx]
            return f"(layer {v[0]}, {'KV'[v[1].as_long()]}, head {v[2]}, slot {v[3]}, dim {v[4]})"

        return (
            f"kv_heads={m.eval(dims.kv_heads)} block_size={m.eval(dims.block_size)}: reading "
            f"{show(a)} as heads_major hits offset {m.eval(read_at, True)}, where the "
            f"tokens_major buffer holds {show(held)}; a head was read from the token axis"
        )

    return "heads_major reader on a tokens_major buffer", z3.And(positive, small), laws, render


def incident3_claim() -> LayoutClaim:
    return _check("layout:bug:incident3", [_incident3_instance], "no counterexample")


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
