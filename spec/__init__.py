"""The KV-ownership model: pure Python, no torch, networkx or z3.

States (``state``), actions one function each (``actions`` with ``actions_prefill``,
``actions_decode``, ``actions_env``; guards and helpers in ``common``), properties one
predicate each (``properties``), bug mutants (``mutants``), finite configs and their pinned
outcomes (``config``, ``pinned.json``), the handoff manifest and its compatibility rule
(``manifest``, ``manifest_fields``) and the TP/CP/block-size/axis-order shard maps
(``shardmap``). SPEC.md, INVARIANTS.md and EVENTLOG.md document it.

Every other package imports from here; this one imports from none of them.
"""

__all__ = [
    "actions",
    "actions_decode",
    "actions_env",
    "actions_prefill",
    "common",
    "config",
    "manifest",
    "manifest_fields",
    "mutants",
    "properties",
    "shardmap",
    "state",
]
