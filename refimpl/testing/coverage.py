"""What a fuzzing run exercised: actions by outcome, and the properties it pressed.

``Coverage.pairs`` counts (action, outcome) pairs ("ok", "refused:<property>",
"refused": not enabled); ``Coverage.edges``, when collecting, holds the edges of the
spec's graph taken (``edge_key``: the same key the graph tour, ``tour``, gives the
explorer's edges).

``NONTRIVIAL`` says, per safety property, on which states it has something to say (a
wrong step there could break it); ``Coverage`` sums accepted and refused steps and those
states over a run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spec.actions import ACTIONS
from spec.actions_decode import decode_msg_stale
from spec.actions_prefill import prefill_msg_stale
from spec.common import full_ranks, used_d, used_h, used_p
from spec.config import Config
from spec.properties import SAFETY
from spec.state import (
    CANCELLED,
    CHUNKS,
    COMPLETE,
    DF_MISMATCH,
    FAILED,
    FILLING,
    IDLE,
    M_HANDOFF_BAD,
    NONE,
    QUARANTINED,
    RESERVED,
    RUNNING,
    TO_DECODE,
    TO_PREFILL,
    WRITABLE,
    World,
    canonical,
    msg_epoch,
    msg_kind,
)

PREDS = {p.id: p.pred for p in SAFETY if p.pred is not None}


def _any(w: World, f: Callable[[Any], bool]) -> bool:
    return any(f(r) for r in w.reqs)


def _stale_in_flight(r: Any) -> bool:
    """A message in flight that its receiver must not act on: of an older epoch, or one
    the spec's receivers can only discard."""
    for x in r.net:
        if msg_epoch(x) < max(r.ep, r.dep):
            return True
        kind = msg_kind(x)
        if kind in TO_PREFILL and prefill_msg_stale(r.st, r.ps, r.ep, x):
            return True
        if kind in TO_DECODE and kind not in CHUNKS and decode_msg_stale(r, x):
            return True
    return False


def _crowded(w: World, c: Config) -> bool:
    over_p = used_p(w, c) + c.blocks > c.cap_p
    over_d = c.handoff and used_d(w, c) + c.blocks > c.cap_d
    over_h = c.offload and used_h(w, c) + c.blocks > c.cap_h
    return bool(over_p or over_d or over_h or w.pfx_ref)


_HELD = (COMPLETE, WRITABLE)
_WAITING = (RESERVED, FILLING)


def _two_copies(r: Any) -> bool:
    return bool((r.p == WRITABLE and r.d != NONE) or (r.d == WRITABLE and r.p != NONE))


def _ended_busy(r: Any) -> bool:
    return r.st in (CANCELLED, FAILED) and bool(r.d or r.p or r.ps != IDLE or r.net)


# Where each safety property has something to say: a state where a wrong step could break
# it (its antecedent holds, or the moment it guards is under way).
NONTRIVIAL: dict[str, Callable[[World, Config], bool]] = {
    "SingleWriter": lambda w, c: _any(w, _two_copies),
    "NoPartialUse": lambda w, c: _any(
        w, lambda r: r.d in _HELD or (r.d in _WAITING and r.rmask == full_ranks(c))
    ),
    "NothingLost": lambda w, c: _any(
        w, lambda r: r.st == RUNNING and (r.p != WRITABLE or r.d != NONE or r.h != NONE)
    ),
    "FrozenSnapshot": lambda w, c: _any(w, lambda r: r.p == COMPLETE),
    "Fencing": lambda w, c: _any(w, _stale_in_flight),
    "NoReuseUnderIO": lambda w, c: _any(
        w,
        lambda r: (
            FILLING in (r.p, r.h) or r.d == QUARANTINED or any(msg_kind(x) in CHUNKS for x in r.net)
        ),
    ),
    "StickyEnd": lambda w, c: _any(w, _ended_busy),
    "ManifestGate": lambda w, c: _any(
        w, lambda r: r.dfl & DF_MISMATCH or any(msg_kind(x) == M_HANDOFF_BAD for x in r.net)
    ),
    "CapacityRefcount": _crowded,
    "RankAgreement": lambda w, c: _any(w, lambda r: r.d in _WAITING and r.rmask != 0),
    "PublishAfterCommit": lambda w, c: _any(w, lambda r: r.h != NONE),
    "LoadXorStore": lambda w, c: _any(w, lambda r: FILLING in (r.p, r.h)),
    "ContentIdentity": lambda w, c: (
        not w.pfx_ok or _any(w, lambda r: c.identity and r.ps != IDLE and r.stg < c.blocks)
    ),
}
assert set(NONTRIVIAL) == set(PREDS)


EdgeKey = tuple[World, str, object, int]


def edge_key(w: World, name: str, i: int, arg: int) -> EdgeKey:
    """An edge of the symmetry-reduced graph: the canonical pre-state, the action, the
    request it acts on (its record: identical requests are one edge) and the argument."""
    who: object = w.reqs[i] if ACTIONS[name].arg in ("req", "msg") else i
    return (canonical(w), name, who, arg)


@dataclass
class Coverage:
    """What a fuzzing run exercised, summed over its examples."""

    accepted: Counter[str] = field(default_factory=Counter)  # action -> accepted steps
    refused: Counter[str] = field(default_factory=Counter)  # property ID or "not enabled"
    refused_actions: Counter[str] = field(default_factory=Counter)  # action -> refusals
    properties: Counter[str] = field(default_factory=Counter)  # ID -> non-trivial checks
    states: set[World] | None = None  # canonical abstract states visited (when collecting)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (action, outcome)
    edges: set[EdgeKey] | None = None  # graph edges taken (when collecting: ``edge_key``)

    def took(self, w: World, name: str, i: int, arg: int) -> None:
        """An accepted step from the spec state ``w`` (an edge of the graph)."""
        if self.edges is not None:
            self.edges.add(edge_key(w, name, i, arg))

    def step(self, name: str, outcome: str) -> None:
        self.pairs[(name, outcome)] += 1
        if outcome == "ok":
            self.accepted[name] += 1
        else:
            self.refused_actions[name] += 1
            self.refused[outcome.partition(":")[2] or "not enabled"] += 1

    def visit(self, w: World, c: Config) -> list[str]:
        """Count the properties non-trivial on ``w``; returns their IDs."""
        hot = [pid for pid, f in NONTRIVIAL.items() if f(w, c)]
        self.properties.update(hot)
        if self.states is not None:
            self.states.add(canonical(w))
        return hot

    def merge(self, other: Coverage) -> None:
        self.accepted += other.accepted
        self.refused += other.refused
        self.refused_actions += other.refused_actions
        self.properties += other.properties
        self.pairs += other.pairs
        if self.states is not None and other.states is not None:
            self.states |= other.states
        if self.edges is not None and other.edges is not None:
            self.edges |= other.edges


def state_share(visited: set[Any], config: Config) -> tuple[int, int]:
    """(visited, total) canonical abstract states of ``config``'s explicit graph."""
    from model_checks.explicit.explore import explore

    states = set(explore(config).states)
    outside = visited - states
    if outside:  # the machine checks refinement, so this is a bug of the harness
        raise AssertionError(f"{len(outside)} visited states are not in the spec's graph")
    return len(visited), len(states)
