"""Model-based fuzzing of a KV-ownership implementation against the spec (Hypothesis).

Ship-in-the-package testing, parametrised by the implementation: ``make_machine(adapter,
config)`` builds a ``RuleBasedStateMachine`` that drives your implementation (through an
``Adapter``/``Subject``) in lockstep with the spec, one rule per spec action and one
invariant per property ID. ``EngineAdapter`` plugs in the torch reference engine.

    from refimpl.testing import EngineAdapter, make_machine
    TestHandoff = make_machine(EngineAdapter(), CONFIGS["handoff_tp2to1"]).TestCase

Modules: ``harness`` (the lockstep harness, coverage, replay), ``machine`` (the
Hypothesis machine), ``tempo`` (the per-example schedule), ``run`` (profiles, hunts,
the kill matrix), ``adapter`` (the reference engine as an Adapter), ``tour`` (the graph
tour).

The graph tour. The random walk finds what is shallow and common; the explorer knows
every reachable abstract state and edge. ``tour.plan_tour`` turns a config's graph into
short sequences from the initial state that cover every edge (small worlds) or every
reachable (action, outcome) pair ("ok", "refused:<property>", "refused": not enabled);
``tour.run_tour`` replays them through the same harness (refinement after every step,
every property, integrity, bytes and ghost, the refusal probes on every state reached,
the drain at the end). Hypothesis keeps its role for data and interleavings; the tour
guarantees coverage, deterministically: the suite's coverage pin and kill matrix are
tours (tests/fuzz/test_tour.py, test_tour_kills.py), ``kvown fuzz --tour`` runs the full
tour and prints the coverage report, and ``kvown fuzz --mutant`` / ``kvown mutate
--target refimpl`` judge by the tour first, the fuzz run second.
"""

from refimpl.testing.adapter import EngineAdapter, EngineSubject
from refimpl.testing.harness import Adapter, Coverage, Divergence, Subject, replay_program
from refimpl.testing.machine import SpecMachine, Tally, make_machine, program_trace

__all__ = [
    "Adapter",
    "Coverage",
    "Divergence",
    "EngineAdapter",
    "EngineSubject",
    "SpecMachine",
    "Subject",
    "Tally",
    "make_machine",
    "program_trace",
    "replay_program",
]
