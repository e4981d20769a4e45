"""Constant-folding connectives of the z3 encodings (``model_checks.symbolic.core``
re-exports them): ``A``/``O``/``N``/``ITE``/``EQ``/``IN`` build z3 terms, but fold Python
ints and bools, so the finite encoding of a concrete config simplifies as it is built."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import z3

Z = Any  # a z3 term, or a Python int/bool standing for a constant


# -- constant-folding connectives ---------------------------------------------------------
def A(*xs: Z) -> Z:
    """Conjunction; Python bools are folded."""
    out = []
    for x in xs:
        if x is True:
            continue
        if x is False:
            return False
        out.append(x)
    if not out:
        return True
    return out[0] if len(out) == 1 else z3.And(*out)


def O(*xs: Z) -> Z:  # noqa: E743 - a connective, named like A and N
    """Disjunction; Python bools are folded."""
    out = []
    for x in xs:
        if x is False:
            continue
        if x is True:
            return True
        out.append(x)
    if not out:
        return False
    return out[0] if len(out) == 1 else z3.Or(*out)


def N(x: Z) -> Z:
    if isinstance(x, bool):
        return not x
    return z3.Not(x)


def ITE(c: Z, a: Z, b: Z) -> Z:
    if c is True:
        return a
    if c is False:
        return b
    if same(a, b):
        return a
    return z3.If(c, a, b)


def EQ(a: Z, b: Z) -> Z:
    """``a == b`` that stays a Python bool on two constants."""
    if isinstance(a, (int, bool)) and isinstance(b, (int, bool)):
        return a == b
    if same(a, b):
        return True
    return a == b


def IN(x: Z, vals: Iterable[int]) -> Z:
    return O(*(EQ(x, v) for v in vals))


def same(a: Z, b: Z) -> bool:
    """Syntactically the same term (or the same constant)."""
    if isinstance(a, z3.ExprRef) and isinstance(b, z3.ExprRef):
        return bool(a.eq(b))
    if isinstance(a, z3.ExprRef) or isinstance(b, z3.ExprRef):
        return False
    return bool(type(a) is type(b) and a == b)


def flag(word: Z, bit: int) -> Z:
    """Is ``bit`` set in the flag word (a bit-vector or a Python int)?"""
    if isinstance(word, int):
        return bool(word & bit)
    return (word & bit) != 0
