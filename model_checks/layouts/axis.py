"""Axis order: the layouts' flat index is a bijection for all dimension sizes (symbolic dims,
``spec.shardmap.flat_index`` evaluated on z3 terms), and incident 3 (a layout read with the wrong
axis order) as a counterexample."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import z3

from model_checks.layouts.common import (
    Instance,
    LayoutClaim,
    Z,
    between,
    check_instances,
    differ,
)
from spec import shardmap as sm

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
            differ(a, b),
        ),
        "in-range": z3.And(_in_box(dims, a), z3.Or(fa < 0, fa >= numel)),
        "onto": z3.And(
            between(0, n, numel),
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
    return check_instances(
        "layout:axis_order", [partial(_axis_instance, s, d) for s, d in pairs], covered
    )


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
            differ(a, held),
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
    return check_instances("layout:bug:incident3", [_incident3_instance], "no counterexample")
