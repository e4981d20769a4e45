"""Explicit-state model checking: every reachable state of a finite config.

``explore`` builds the state graph (``graph.Graph``; symmetry-reduced, states interned as
ints) and checks every safety predicate and every INVARIANTS.md conjunct on every state,
with one of two cores that build the same graph (the plain one, and ``local``'s: each
request's edges learned once per record and globals) and optionally partial-order
reduction (``por``); ``liveness`` checks NoDeadlock, FairTermination and BoundedExit on
that graph; ``trace`` turns paths into traces (JSON, pretty, DOT) and replays them;
``runner`` checks configs and mutants and finds the shortest counterexamples; ``pin``
compares the outcomes with ``spec/pinned.json``; ``parallel`` (with ``partition``, its
workers) explores on several processes and gives the same graph.
"""

from model_checks.explicit.explore import Graph, explore
from model_checks.explicit.liveness import LiveResult, check_liveness
from model_checks.explicit.parallel import explore_parallel
from model_checks.explicit.runner import (
    ConfigResult,
    MutantResult,
    Violation,
    check_config,
    check_mutant,
    check_suite,
)
from model_checks.explicit.trace import Trace, TraceError, pretty, replay, to_dot

__all__ = [
    "ConfigResult",
    "Graph",
    "LiveResult",
    "MutantResult",
    "Trace",
    "TraceError",
    "Violation",
    "check_config",
    "check_liveness",
    "check_mutant",
    "check_suite",
    "explore",
    "explore_parallel",
    "pretty",
    "replay",
    "to_dot",
]
