"""Conformance: an engine's event log (JSONL, ``spec/EVENTLOG.md``) checked against the spec.

``check_file``/``check_log``/``check_text`` return a ``Verdict``: conforms, or the first
event the spec cannot explain with the property it breaks. Unlogged deliveries are
searched for within a bounded gap. ``LogError`` is malformed input.
"""

from model_checks.conformance.checker import (
    DEFAULT_MAX_GAP,
    Checker,
    Verdict,
    check_file,
    check_log,
    check_text,
)
from model_checks.conformance.events import Event, EventLog, LogError, parse_log

__all__ = [
    "DEFAULT_MAX_GAP",
    "Checker",
    "Event",
    "EventLog",
    "LogError",
    "Verdict",
    "check_file",
    "check_log",
    "check_text",
    "parse_log",
]
