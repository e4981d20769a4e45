"""Model-based fuzzing of a KV-ownership implementation against the spec (Hypothesis).

Ship-in-the-package testing, parametrised by the implementation: ``make_machine(adapter,
config)`` builds a ``RuleBasedStateMachine`` that drives your implementation (through an
``Adapter``/``Subject``) in lockstep with the spec, one rule per spec action and one
invariant per property ID. ``EngineAdapter`` plugs in the torch reference engine.

    from refimpl.testing import EngineAdapter, make_machine
    TestHandoff = make_machine(EngineAdapter(), CONFIGS["handoff_tp2to1"]).TestCase

Modules: ``harness`` (the lockstep harness, coverage, replay), ``machine`` (the
Hypothesis machine), ``tempo`` (the per-example schedule), ``run`` (profiles, hunts,
the kill matrix), ``adapter`` (the reference engine as an Adapter).
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
