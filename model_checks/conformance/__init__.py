"""Conformance: an engine's event log (JSONL, ``spec/EVENTLOG.md``) checked against the spec.

``check_file``/``check_log``/``check_text`` return a ``Verdict``: conforms, or the first
line at which no explanation of the log remains, with every property it breaks (most
specific first; ``Unmodelled`` when none does). Unlogged deliveries are hypotheses,
searched for within a bounded gap. ``Monitor`` is the same check fed event by event.
``LogError`` is malformed input; parsing is strict and streams (``LineParser``).
Modules: ``clocks`` (BoundedExit across per-worker clocks, with the stated skew),
``nearest`` (what an Unmodelled verdict had no path for), ``corpus`` (the mutated-log
corpus issue #21 measures).
"""

from model_checks.conformance.blame import UNMODELLED
from model_checks.conformance.checker import ASSUMABLE, DEFAULT_MAX_GAP, Checker
from model_checks.conformance.events import (
    DEFAULT_SKEW_S,
    NOW,
    Event,
    EventLog,
    LineParser,
    parse_log,
)
from model_checks.conformance.jsonline import LogError
from model_checks.conformance.monitor import Monitor, check_file, check_log, check_text
from model_checks.conformance.verdict import Verdict

__all__ = [
    "ASSUMABLE",
    "DEFAULT_MAX_GAP",
    "DEFAULT_SKEW_S",
    "NOW",
    "UNMODELLED",
    "Checker",
    "Event",
    "EventLog",
    "LineParser",
    "LogError",
    "Monitor",
    "Verdict",
    "check_file",
    "check_log",
    "check_text",
    "parse_log",
]
