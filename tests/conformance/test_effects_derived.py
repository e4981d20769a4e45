"""The checker's effect table (model_checks/conformance/effects.py), derived from the spec's
traced actions: fresh, one entry per action; and the double frees the hand-written tables
it replaced missed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_checks.conformance import check_text
from model_checks.conformance import effects as E
from spec.actions import ACTIONS

TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"


def test_the_stored_table_is_the_derived_one() -> None:
    """effects.json is what the spec's actions give now (else: the command to rewrite it)."""
    now = E.derive()
    stale = sorted(n for n in set(now) | set(E.TABLE) if now.get(n) != E.TABLE.get(n))
    assert stale == [], f"run python -m model_checks.conformance.effects --write ({stale})"


def test_every_action_has_a_derived_entry() -> None:
    """Every spec action is in the table, or one the tracer itself declares it leaves out."""
    assert set(E.TABLE).isdisjoint(E.untraced())
    assert set(E.TABLE) | set(E.untraced()) == set(ACTIONS)


def _once_and_twice(log: str, lines: int) -> tuple[str, str]:
    """The first ``lines`` lines of a fixed twin, and the same with its last event again."""
    head = (TRACES / log).read_text().splitlines()[:lines]
    again = {**json.loads(head[-1]), "note": "logged again: the blocks are already free"}
    return "\n".join(head) + "\n", "\n".join([*head, json.dumps(again)]) + "\n"


# Steps that free a replica the hand-written tables did not list: the second free of
# the same blocks was Unmodelled; the spec's own actions say it frees (a double free).
DOUBLE_FREES = {
    "DecodeRetract": ("fixed_retract_loses_kv.jsonl", 15),
    "SessionEvict": ("fixed_append_after_evict.jsonl", 16),
    "HostLoadFail": ("fixed_failed_load_keeps_hit.jsonl", 6),
}


@pytest.mark.parametrize("action", sorted(DOUBLE_FREES))
def test_a_double_free_the_hand_tables_missed_breaks_capacity_refcount(action: str) -> None:
    once, twice = _once_and_twice(*DOUBLE_FREES[action])
    assert check_text(once, open_end=True).conforms  # once is the protocol
    v = check_text(twice)
    lines = DOUBLE_FREES[action][1]
    assert (v.event or {}).get("action") == action
    assert (v.line, v.properties) == (lines + 1, ["CapacityRefcount"])
