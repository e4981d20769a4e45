"""z3 proofs that the shard maps of ``spec.shardmap`` are bijections: TP (replicated KV
heads included), CP with an uneven last shard, block-size changes and axis orders; and the
counterexample of incident 3 (a layout read with the wrong axis order)."""

import model_checks.z3env  # noqa: F401  (before any term: z3 without its Python debug checks)
from model_checks.layouts.common import LayoutClaim
from model_checks.layouts.proofs import layout_claims

__all__ = ["LayoutClaim", "layout_claims"]
