"""z3 as every checker here loads it: z3's Python layer without its own debug checks.

z3's Python API re-checks each call's arguments in Python (``z3.z3.Z3_DEBUG``, on unless
``python -O``): contexts, sorts and coercions that z3's C API checks again when the term
is made (a sort mismatch still raises ``Z3Exception`` there). The checkers build millions
of terms (the tracer's encodings, BMC's unrollings, the induction's provers), and those
Python-side checks were about a fifth of their CPU (benchmarks/RESULTS.md, issue #33,
s14-fast); the terms made are the same ones. ``KVOWN_Z3_DEBUG=1`` keeps them on (to
debug a term built wrong, or to measure side by side). Importing this module is the
switch: ``model_checks.symbolic`` and ``model_checks.layouts`` import it first (every
term of the checkers is made through one of them)."""

from __future__ import annotations

import os

import z3.z3 as _z3_impl

DEBUG = os.environ.get("KVOWN_Z3_DEBUG") == "1"
_z3_impl.Z3_DEBUG = DEBUG
