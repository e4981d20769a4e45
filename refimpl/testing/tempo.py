"""How the machine spends its steps: a schedule drawn per example (``Tempo``).

A uniform choice among enabled actions cancels a request or loses a message within a few
steps, so runs rarely get deep. The actions fall into groups, and each group waits for
its turn:

    faults     the environment's faults                       every k-th step, or only
    quits      timeouts, the client's cancel, DecodeAbort       in one protocol phase
    endings    validate, commit, finish                        every k-th step
    chores     token steps, discards, prefix eviction,         every k-th step
               preemption and the start of an offload

"Every k-th step" is a pseudo-random 1/k of the steps (a hash of the drawn salt, the step
and the group), so the windows between steps stay open for the other groups: a timeout
can land between validate and commit. Faults and quits may instead be tied to a phase
(``PHASES``): they then run only while some request is in it (as a nemesis schedule
injects faults at protocol points): it then steps as soon as it can there, once. Quits that clean
up an ended request are never held
back; validation and chores wait only while some other step can run. All of it is drawn
by Hypothesis with the example (``tempos(config)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from spec.actions import ACTIONS
from spec.config import Config
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    ENDED,
    FILLING,
    IDLE,
    M_DONE,
    NONE,
    PREFILLING,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
    Req,
    World,
    msg_epoch,
    msg_kind,
)

FAULTS = frozenset(n for n, a in ACTIONS.items() if a.kind == "fault")
# TurnEdit is the client's too (its next prompt shares only a prefix), but no quit: a step
# of the turn chain, in the one-step window between TurnEnd and TurnRoute. Held back with the
# quits, the router always went first, and the machine never routed an edited prompt
# (append_divergent_uncut survived 500 nightly examples; issue #33).
QUITS = frozenset(n for n, a in ACTIONS.items() if a.kind in ("timeout", "client"))
QUITS = QUITS - {"TurnEdit"} | {"DecodeAbort", "DecodeAbortFenced"}
ENDINGS = frozenset({"PrefillFinish", "DecodeFinish", "DecodeValidate", "DecodeCommit"})
CHORES = frozenset(
    {"PrefillDecodeStep", "DecodeStep", "PrefillDiscard", "DecodeDiscard", "DecodeEvictPrefix"}
)
# Moves wait for their turn too, so that tokens are generated before a request is
# preempted or offloaded (else recompute and reload only ever move a bare prompt).
CHORES |= {"PrefillPreempt", "PrefillOffloadBegin"}
HELD_BACK = FAULTS | QUITS | (ENDINGS - {"DecodeValidate"})  # wait for their turn always
GATED = FAULTS | QUITS | ENDINGS | CHORES
INJECTABLE = FAULTS | QUITS


def _HANDOFF(c: Config) -> bool:  # noqa: N802 - a phase's "can this config reach it"
    return c.handoff


def _RETRY(c: Config) -> bool:  # noqa: N802
    return c.handoff and c.max_attempts >= 2


def _done_in_flight(r: Req) -> bool:
    """A running request's decode waits on attempt ``dep`` while one of its RankDones is in
    flight."""
    waiting = r.st == RUNNING and r.d in (RESERVED, FILLING)
    return waiting and any(msg_kind(c) == M_DONE and msg_epoch(c) == r.dep for c in r.net)


PHASES: tuple[tuple[str, Callable[[Req], bool], Callable[[Config], bool]], ...] = (
    ("any", lambda r: True, lambda c: True),
    ("prefilling", lambda r: r.st == PREFILLING or (r.st == RUNNING and r.ep == 0), _HANDOFF),
    ("awaiting ready", lambda r: r.ps == AWAIT_READY, _HANDOFF),
    ("sending", lambda r: r.ps == SENDING, _HANDOFF),
    ("awaiting the ack", lambda r: r.ps == AWAIT_ACK and r.d not in (COMPLETE, WRITABLE), _HANDOFF),
    ("validated", lambda r: r.d == COMPLETE, _HANDOFF),
    ("committed", lambda r: r.d == WRITABLE, _HANDOFF),
    ("after a handoff", lambda r: r.st == RUNNING and r.ep > 0 and r.ps == IDLE, _HANDOFF),
    ("running", lambda r: r.st == RUNNING and r.p == WRITABLE, lambda c: not c.handoff),
    ("storing to host", lambda r: r.h == FILLING, lambda c: c.offload),
    ("loading from host", lambda r: r.p == FILLING, lambda c: c.offload),
    ("offloaded", lambda r: r.h == COMPLETE and r.p == NONE, lambda c: c.offload),
    # a later attempt: the fault budget is not always spent in attempt 1
    ("attempt 2+ awaiting ready", lambda r: r.ps == AWAIT_READY and r.ep >= 2, _RETRY),
    ("attempt 2+ sending", lambda r: r.ps == SENDING and r.ep >= 2, _RETRY),
    ("attempt 2+ awaiting the ack", lambda r: r.ps == AWAIT_ACK and r.ep >= 2, _RETRY),
    # a rank's "done" on the wire, not yet counted: a quit here leaves it to reach the next
    # attempt (Fencing's window; "sending" injects before the first chunk, and decode
    # counts a RankDone the step after it is sent)
    ("a rank's done in flight", _done_in_flight, _RETRY),
)
# Swarm testing: each example switches a random subset of these off (never the steps a
# handoff, an offload or a cleanup needs to finish), so that some examples run long
# without, say, timeouts or token steps, and reach states a uniform mix never does.
# (Faults keep their own schedule, on the clock or aimed at a phase: with one fault in a
# run, switching kinds off too left duplicates and manifest mismatches untried in ci.)
SWARMABLE = QUITS - {"DecodeAbort"} | {"PrefillDecodeStep", "DecodeStep", "PrefillPreempt"}


def _mix(*xs: int) -> int:
    """A small deterministic hash of ints (str hashes are salted per process)."""
    h = 0x811C9DC5
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 0x01000193) & 0xFFFFFFFF
    return h >> 7


def ended(w: World, args: dict[str, Any]) -> bool:
    """Does this step act on a request that has ended (a cleanup, not a derailment)?"""
    return "req" in args and w.reqs[args["req"]].st in ENDED


@dataclass(frozen=True)
class Tempo:
    salt: int = 0  # which steps each group gets
    fault_every: int = 1  # faults: on about 1 step in k ...
    fault_when: int = 0  # ... or (not 0) only while a request is in PHASES[fault_when]
    quit_every: int = 1
    quit_when: int = 0
    end_every: int = 1  # validate, commit, finish
    chore_every: int = 1  # token steps, discards, prefix eviction
    probe_every: int = 1  # refusal probes (named refusals, arbitrary_step)
    off: frozenset[str] = frozenset()  # swarm: actions this example never takes

    def due(self, every: int, k: int, tag: int) -> bool:
        return every == 1 or _mix(self.salt, k, tag) % every == 0

    def _in_phase(self, when: int, w: World, args: dict[str, Any]) -> bool:
        pred = PHASES[when][1]
        reqs = (w.reqs[args["req"]],) if "req" in args else w.reqs
        return any(pred(r) for r in reqs)

    def injects(self, name: str) -> bool:
        """Is the group of ``name`` tied to a phase? Then it is injected: while some request
        is in that phase and the group can act on it, only the group may step."""
        return bool((name in FAULTS and self.fault_when) or (name in QUITS and self.quit_when))

    def injected(self, name: str) -> Tempo:
        """The schedule after the injection of ``name``'s group (it keeps to the clock)."""
        return replace(self, fault_when=0) if name in FAULTS else replace(self, quit_when=0)

    def clocked(self, name: str) -> bool:
        """Does the turn of ``name`` come with the clock (rather than with a phase)?"""
        if name in FAULTS:
            return not self.fault_when
        if name in QUITS:
            return not self.quit_when
        return name in GATED

    def allows(self, name: str, k: int, w: World, args: dict[str, Any]) -> bool:
        """May step ``k`` (0-based) be ``name(args)`` in state ``w``?"""
        if name in self.off and not ended(w, args):
            return False
        if name in FAULTS:
            if self.fault_when:
                return self._in_phase(self.fault_when, w, args)
            return self.due(self.fault_every, k, 0)
        if name in QUITS:
            if ended(w, args):
                return True
            if self.quit_when:
                return self._in_phase(self.quit_when, w, args)
            return self.due(self.quit_every, k, 1)
        if name in ENDINGS:
            return self.due(self.end_every, k, 2)
        if name in CHORES:
            return self.due(self.chore_every, k, 3)
        return True


def tempos(c: Config) -> st.SearchStrategy[Tempo]:
    """Schedules for config ``c``: faults and quits on the clock or tied to one of the
    phases ``c`` can reach."""
    phases = [k for k, (_, _, can) in enumerate(PHASES) if k and can(c)]
    when = st.sampled_from((0, 0, *phases))
    return st.builds(
        Tempo,
        salt=st.integers(0, 2**16 - 1),
        fault_every=st.sampled_from((2, 1, 4, 8)),
        fault_when=when,
        quit_every=st.sampled_from((12, 25, 6)),
        quit_when=when,
        end_every=st.sampled_from((12, 25, 6)),
        chore_every=st.sampled_from((25, 8)),
        probe_every=st.sampled_from((25, 8)),
        off=st.frozensets(st.sampled_from(sorted(SWARMABLE))),
    )
