"""Restarts: a crashed worker comes back as a new incarnation (``Config.restarts``).

A crash (``EnvCrash``) takes the worker's pools, its in-flight writes and the messages
to it. ``EnvRestart`` brings it back as incarnation ``inc + 1`` (``World.p_inc`` /
``World.d_inc``) with empty pools: its memory is registered afresh, so nothing of the
old pool is trusted (no replica, no prefix, no registration).

What the engines do: a Mooncake/NIXL peer that restarts registers new memory and
publishes new metadata (a new segment / agent metadata; Dynamo a new lease and instance
id); the old remote keys are invalid, so a one-sided write addressed to the dead
process's registration fails at the NIC, and a control message carrying the old
session / instance id is dropped by its receiver. The model says the same:

- every message carries an incarnation (``spec.state.msg_inc``): a control message its
  sender's (stamped by ``common.send``), a one-sided write (``Chunk``) the incarnation of
  the decode registration it targets, learnt from the ``Ready`` that opened the attempt
  (``Req.rinc``);
- a message of an older incarnation than its peer's current one is *fenced*: it
  changes nothing but the network (``Fencing``; ``steps.stale_changes_nothing``): a
  control message is refused and then discarded, a write fails at the invalid
  registration (``DecodeReceiveChunk`` consumes it, nothing lands).

Requests keep the fates of the crash (SPEC.md, "Crash fates"): the crash already failed
those the dead incarnation owned. The restart changes no request status: a running
request whose handoff was bound to a dead decode incarnation ends by ``PrefillTimeout``
(fail closed; the router may retry it as a new request), and a request that had not
frozen yet hands off to the new incarnation.

A message of the current incarnation of a crashed, not yet restarted, worker is not
fenced (no newer incarnation exists): that is the crash model without restarts.
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Result
from spec.config import Config
from spec.state import CHUNKS, TO_PREFILL, World, msg_inc, msg_kind

__all__ = ["EnvRestart", "older_incarnation", "fenced"]


def older_incarnation(w: World, code: int) -> bool:
    """Is message ``code`` of an older incarnation than the one its receiver talks to? A
    control message: older than its sender's current incarnation; a write: older than
    the decode incarnation whose pool it would land in."""
    kind = msg_kind(code)
    now = w.d_inc if kind in CHUNKS or kind in TO_PREFILL else w.p_inc
    return msg_inc(code) < now


def fenced(w: World, c: Config, m: Mutants, code: int) -> bool:
    """Does the receiver fence message ``code`` (an older incarnation's)? The mutants
    drop one check each: ``stale_incarnation_accepted`` the control messages',
    ``restart_keeps_pool`` the writes' (the new pool honours the old registration)."""
    if not c.restarts or not older_incarnation(w, code):
        return False
    if msg_kind(code) in CHUNKS:
        return "restart_keeps_pool" not in m
    return "stale_incarnation_accepted" not in m


def EnvRestart(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Worker ``arg`` (0: prefill, 1: decode), crashed, comes back as a new incarnation
    with empty pools; at most ``Config.restarts`` restarts in all."""
    if w.p_inc + w.d_inc >= c.restarts:
        return NOT_ENABLED
    if arg == 0 and not w.p_up:
        return w._replace(p_up=True, p_inc=w.p_inc + 1)
    if arg == 1 and not w.d_up:
        return w._replace(d_up=True, d_inc=w.d_inc + 1)
    return NOT_ENABLED
