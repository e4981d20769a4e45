"""The spec in z3: one encoding of the actions shared by BMC and the unbounded model.

``core`` (terms and the action context), ``tracer`` (the spec's own Python
actions run on symbolic values: their ``Rules``), ``actions`` (the registry of the traced
actions, and the crash's hand mirror), ``props`` (the safety properties),
``finite``/``encoding`` (a finite config as <init, trans, bad>), ``bmc`` (bounded model
checking of the mutants at their BFS depth), ``unbounded``/``invariants``/``induction``
(requests as a sort, ghost counters, the inductive strengthening of INVARIANTS.md),
``agree``/``agree_unbounded`` (the encodings agree with the explicit spec), ``claims``
(what ``kvown prove`` runs).
"""

import model_checks.z3env  # noqa: F401  (before any term: z3 without its Python debug checks)
from model_checks.symbolic.bmc import BmcResult, bmc, correct_bmc, mutant_bmc
from model_checks.symbolic.claims import GROUPS, Claim, run_all
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.induction import CTI, Proof, Prover

__all__ = [
    "CTI",
    "GROUPS",
    "BmcResult",
    "Claim",
    "Encoding",
    "Proof",
    "Prover",
    "bmc",
    "correct_bmc",
    "mutant_bmc",
    "run_all",
]
