"""The environment's early deliveries on an unrevocable transport (``Config.revocable=
False``): a stutter each, the spec's state unchanged, that shows whether a Sender waits
for its writes before it says Quiesced (``refimpl.api.unrevocable.ends``).

``early_nacks`` hands the Senders a Nack in flight while writes of its attempt are in
flight (delivery order is free; ``ApiActions.early_nack``); ``early_aborts`` gives the
Senders the engine's abort (its timeout, a cancel) while writes of the attempt are in
flight (the engine's clock is free; ``ApiActions.early_abort``). The spec refuses the
step that would end the attempt there (``PrefillResume``: FrozenSnapshot,
``PrefillTimeout`` / ``PrefillQuiesce``: NoReuseUnderIO): the Senders must keep the
attempt and its pins, and say nothing, until the walk takes that step once the writes
landed. The refinement map and every property are checked after each hand-over.
"""

from __future__ import annotations

from typing import Any

from refimpl.testing.harness import Harness
from spec.actions import ACTIONS, decode_args
from spec.common import chunks_in_flight
from spec.state import IDLE, M_NACK, msg_epoch, msg_kind

__all__ = ["early_aborts", "early_nacks"]

ENDS = {"PrefillTimeout": "timeout", "PrefillQuiesce": "cancelled"}  # the abort's reason
PREFILL_WIDE = frozenset({"EnvCrash", "EnvRestart"})  # steps that reach every Sender


def early_nacks(h: Harness, rest: list[dict[str, Any]]) -> int:
    """Hand the Senders every Nack in flight whose attempt still has writes in flight,
    where the walk's next step on that message (``rest``) is ``PrefillResume`` (so no
    later step loses, duplicates or discards it on the wire). Returns how many."""
    early = getattr(h.impl, "early_nack", None)
    if h.c.revocable or early is None:
        return 0
    n = 0
    for i, r in enumerate(h.w.reqs):
        for code in sorted(set(r.net)):
            if msg_kind(code) != M_NACK or not chunks_in_flight(r, msg_epoch(code)):
                continue
            uses = (st["action"] for st in rest if _names(st, i, code))
            if next(uses, None) != "PrefillResume":
                continue
            if early(i, code):
                h.check_refinement(f"the Nack {code} read early, writes in flight")
                h.check_state()
                n += 1
    return n


def early_aborts(h: Harness, rest: list[dict[str, Any]]) -> int:
    """Give the Senders of every request whose attempt still has writes in flight the
    engine's abort, where the walk's next step that reaches its Senders (``rest``: a
    prefill step of the request, a crash or restart) ends the attempt (``ENDS``) with
    that reason. Returns how many."""
    early = getattr(h.impl, "early_abort", None)
    if h.c.revocable or early is None or not h.w.p_up:
        return 0
    n = 0
    for i, r in enumerate(h.w.reqs):
        if r.ps == IDLE or not chunks_in_flight(r, r.ep):
            continue
        reaches = (st["action"] for st in rest if _reaches_sender(st, i))
        reason = ENDS.get(next(reaches, ""))
        if reason is not None and early(i, reason):
            h.check_refinement(f"the abort ({reason}) given early, writes in flight")
            h.check_state()
            n += 1
    return n


def _reaches_sender(st: dict[str, Any], i: int) -> bool:
    """Does the step ``st`` reach request ``i``'s Senders?"""
    name = st["action"]
    if name in PREFILL_WIDE:
        return True
    return name.startswith("Prefill") and decode_args(name, st["args"])[0] == i


def _names(st: dict[str, Any], i: int, code: int) -> bool:
    """Does the step ``st`` take (or fault) message ``code`` of request ``i``?"""
    if ACTIONS[st["action"]].arg != "msg":
        return False
    return decode_args(st["action"], st["args"]) == (i, code)
