"""The inductive invariant's strengthening conjuncts (spec/INVARIANTS.md), by name.

The z3 proof proves each safety property with the property and a few of these
conjuncts, each traced from its predicate here (``model_checks/symbolic/invariants.py``);
each is a predicate over the explicit ``World``, so ``kvown check`` also evaluates it on
every explored state (kind ``invariant``) and reports a broken one by its name with its
counterexample. ``scope`` is how the proof splits it (``tracer.predicate.conj_*``).

A conjunct is claimed where the proof covers the world: the unbounded model has no
restarts (``Config.restarts``), and proves ``PrefixOwn``, ``StagedOnly`` and
``NoUnstaged`` for worlds without staging (``Config.identity`` off). ``applies`` says so;
the explorer evaluates a conjunct only where it applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spec.behaviours.turns import turn_idle, turn_quiet
from spec.config import Config
from spec.invariants import conjuncts as _c
from spec.state import World

Pred = Callable[[World, Config], bool]


def _proved(c: Config) -> bool:
    """The worlds the unbounded model covers."""
    return c.restarts == 0


def _unstaged(c: Config) -> bool:
    """... and, for the staging conjuncts, without staging."""
    return c.restarts == 0 and not c.identity


@dataclass(frozen=True)
class Conjunct:
    name: str
    scope: str  # "request", "slot" (every message slot of every request) or "global"
    doc: str
    pred: Pred
    applies: Callable[[Config], bool] = _proved


INVARIANTS: dict[str, Conjunct] = {
    j.name: j
    for j in (
        Conjunct("TypeOK", "request", "every field in range; dep <= ep", _c.type_ok),
        Conjunct("MsgOK", "slot", "messages are of attempts that exist", _c.msg_ok),
        Conjunct("Frozen", "request", "a sender not idle has a frozen source", _c.frozen),
        Conjunct("DecodeEpoch", "request", "a decode replica's epoch >= 1", _c.decode_epoch),
        Conjunct("DecodeCurrent", "request", "a live decode replica is current", _c.decode_current),
        Conjunct(
            "DecodeLiveSource",
            "request",
            "while decode is live, prefill's copy is frozen or gone",
            _c.decode_live_source,
        ),
        Conjunct("IdleSeen", "request", "an idle sender's attempt was seen", _c.idle_seen),
        Conjunct("SameHit", "request", "past Ready, prefill sends decode's hit", _c.same_hit),
        Conjunct(
            "ChunksHaveHome",
            "request",
            "chunks still to send have held (or fenced) destination blocks",
            _c.chunks_have_home,
        ),
        Conjunct(
            "FailedNeedsSwitch",
            "request",
            "an attempt failed on decode only with decode_failure",
            _c.failed_needs_switch,
        ),
        Conjunct(
            "HandoffFresh",
            "slot",
            "an unseen manifest is of the current, frozen attempt",
            _c.handoff_fresh,
        ),
        Conjunct("ReadyMatches", "slot", "a Ready carries decode's hit", _c.ready_matches),
        Conjunct("NackGaveUp", "slot", "a Nack means decode gave up", _c.nack_gave_up),
        Conjunct("AckCommitted", "slot", "an Ack means decode committed", _c.ack_committed),
        Conjunct(
            "QuiescedStopped", "slot", "a Quiesced means prefill stopped", _c.quiesced_stopped
        ),
        Conjunct("ChunkOnce", "slot", "a chunk in flight once, sent, not landed", _c.chunk_once),
        Conjunct("LandedSent", "slot", "what landed was sent", _c.landed_sent),
        Conjunct("StepHeld", "request", "a step in flight has its replica", _c.step_held),
        Conjunct("DownEmpty", "request", "a crashed worker holds nothing", _c.down_empty),
        Conjunct("PrefixOwn", "global", "the cached prefix holds its KV", _c.prefix_own, _unstaged),
        Conjunct(
            "StagedOnly",
            "request",
            "no replica holds an unstaged chunk",
            _c.staged_only,
            _unstaged,
        ),
        Conjunct("NoUnstaged", "slot", "no unstaged chunk in flight", _c.no_unstaged, _unstaged),
        Conjunct("TurnIdle", "request", "a session between turns ended its handoff", turn_idle),
        Conjunct("TurnQuiet", "slot", "a session between turns has nothing in flight", turn_quiet),
    )
}


def for_config(c: Config) -> list[tuple[str, Pred]]:
    """(name, predicate) of each conjunct claimed in ``c``, in the registry's order."""
    return [(j.name, j.pred) for j in INVARIANTS.values() if j.applies(c)]


def broken_invariants(w: World, c: Config) -> list[str]:
    """Names of the conjuncts claimed in ``c`` that ``w`` breaks."""
    return [name for name, pred in for_config(c) if not pred(w, c)]


__all__ = ["INVARIANTS", "Conjunct", "Pred", "broken_invariants", "conjuncts", "for_config"]
