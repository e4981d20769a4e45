"""Counterexamples on real tensors: the machinery behind the ``repro/`` scripts.

A reproduction (``Repro``) takes the model check's minimal counterexample for a mutant,
replays it on the reference engine with the bug switched on (each step checked against the
mutant spec), measures the concrete damage on real bytes and allocators, then replays it
with the bug off and shows the typed refusal, or survival with nothing lost.

Modules: ``common`` (steps, counterexamples, damage measures, ``Result``, ``guarded``),
``repro`` (the ``Repro`` class and the bounded ``wait``).
"""

from refimpl.replay.common import (
    NEXT,
    Out,
    Result,
    Step,
    Waited,
    counterexample,
    diff_elems,
    fmt_step,
    guarded,
    held_blocks,
    msg,
    prefetch,
    statuses,
    step,
)
from refimpl.replay.repro import (
    Repro,
    choose,
    late_step_damage,
    late_write_quarantined,
    next_request_writes,
    replay_one,
)

__all__ = [
    "NEXT",
    "Out",
    "Repro",
    "Result",
    "Step",
    "Waited",
    "choose",
    "counterexample",
    "diff_elems",
    "fmt_step",
    "guarded",
    "held_blocks",
    "late_step_damage",
    "late_write_quarantined",
    "msg",
    "next_request_writes",
    "prefetch",
    "replay_one",
    "statuses",
    "step",
]
