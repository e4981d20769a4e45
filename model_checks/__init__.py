"""Checkers of the spec: they hold no protocol rule of their own (rules live in ``spec``).

Subpackages:

- ``explicit``: exhaustive BFS into networkx, liveness on the same graph, traces
  (JSON, pretty print, DOT), the pinned outcomes;
- ``symbolic``: the z3 encoding of the same actions, BMC, inductive invariants for any
  number of requests, and the agreement checks with the explicit spec;
- ``layouts``: z3 proofs that the shard maps (TP, CP, block size, axis order) are
  bijections;
- ``conformance``: an engine's event log checked against the spec (``kvown check-trace``).

The ``kvown`` command line is the package ``kvown_cli``, a thin user of these.
"""

import importlib
from typing import Any

__all__ = ["conformance", "explicit", "layouts", "symbolic"]


def __getattr__(name: str) -> Any:
    # Lazy: `import model_checks.explicit` need not load z3.
    if name in __all__:
        return importlib.import_module(f"model_checks.{name}")
    raise AttributeError(f"module 'model_checks' has no attribute {name!r}")
