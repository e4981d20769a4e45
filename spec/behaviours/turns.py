"""Multi-turn append on decode (PPD): turn 2+ is prefilled where the session's KV is.

Engines: SGLang keeps a session's KV on the decode worker between turns and appends the
next turn's new tokens there (streaming sessions, ``session_params``: the request
continues a ``rid`` whose KV is kept); Dynamo's KV router scores workers by the overlap
of the new prompt's block hashes with what each worker holds (``KvIndexer``, the longest
matching prefix) and routes turn 2 to decode when it holds the conversation (PPD: prefill
on decode, "conditional disaggregation"); vLLM matches the longest cached token prefix
(``find_longest_cache_hit``) and recomputes only the rest. The bugs are in the seams:
the KV evicted between turns while the router still names decode as its holder; a new
prompt whose token ids differ from the cached ones after a point (a re-tokenised or
edited history) appended after the stale tail; two turns of one session writing at once.

Model (``Config.turns``; ``Req.tn``/``ti``/``tdv``/``tc``): a running request on decode
(``d`` writable) ends its turn and keeps its KV there (``TurnEnd``: ``ti = 1``, the
session idle between turns). The client's next prompt may share only part of it
(``TurnEdit``: ``tdv = 1``, a divergent tail). The router then either routes the turn
to decode (``TurnRoute``: the session's KV must still be there; it is **pinned** from
this decision, ``tn = 1``, until the append commits) or falls back to prefill
(``TurnPrefill``: decode's copy, if any, is dropped and the request is computed again,
as a retraction is). Decode cuts a divergent tail (``DecodeTurnCut``) so that the append
starts at the longest common prefix, appends the turn's new tokens (``DecodeAppend``,
``tn = 2``: the session's one writer) and commits (``DecodeAppendCommit``: the turn
decodes). Between turns, an unpinned session may be evicted (``SessionEvict``): its KV is
freed and the request is marked preempted, so the next turn is prefilled (a defined
state, never half-appended). One more turn per request (``tc``) keeps the worlds finite.

Properties: ``NothingLost`` (a turn routed to decode has the session's KV there until
its append commits), ``SingleWriter`` (an append never writes while the session's turn
still decodes), ``ContentIdentity`` (a divergent tail is never appended to or decoded
on). Bugs (``spec/mutants.py``): ``append_after_evict``, ``append_divergent_uncut``,
``two_writers_on_session``, ``evict_pinned_session``.
"""

from __future__ import annotations

from spec.actions_decode import _free
from spec.actions_env import back_to_prefill
from spec.common import NOT_ENABLED, Mutants, Result, put, refuse
from spec.config import Config
from spec.state import COMPLETE, ENDED, IDLE, NONE, PREEMPTED, RUNNING, WRITABLE, Req, World

__all__ = [
    "DecodeAppend",
    "DecodeAppendCommit",
    "DecodeTurnCut",
    "SessionEvict",
    "TurnEdit",
    "TurnEnd",
    "TurnPrefill",
    "TurnRoute",
    "session_pinned",
    "turn_idle",
    "turn_quiet",
    "turns_single_writer",
    "turns_identity",
    "turns_kept",
]

ROUTED = 1  # tn: the turn is routed to decode; the session's blocks are pinned
APPENDING = 2  # tn: decode writes the turn's new tokens onto the session's KV


def session_pinned(r: Req) -> bool:
    """Is the session's KV pinned (routed to decode, append not committed)? Nothing
    frees decode's replica then (``spec/actions_decode.py`` reads ``tn`` directly)."""
    return r.tn != 0


def TurnEnd(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The turn ends; decode keeps the session's KV for the next turn."""
    r = w.reqs[i]
    if not c.turns or not w.d_up or r.d != WRITABLE or r.st != RUNNING:
        return NOT_ENABLED
    if r.ti or r.tn or r.dstep or r.tc >= c.max_turns:
        return NOT_ENABLED
    if r.p != NONE or r.net:  # the handoff is over: the source freed, nothing in flight
        return NOT_ENABLED
    return put(w, i, r._replace(ti=1))


def TurnEdit(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The client's next prompt shares only a prefix of the session's token ids (an
    edited or re-tokenised history): decode's KV has a tail the prompt does not have."""
    r = w.reqs[i]
    if not c.turns or r.ti != 1 or r.tn or r.tdv or r.st != RUNNING or r.d != WRITABLE:
        return NOT_ENABLED
    return put(w, i, r._replace(tdv=1))


def TurnRoute(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The router sends the next turn to the decode worker that holds the session; the
    session's blocks are pinned from here until the append commits."""
    r = w.reqs[i]
    if not c.turns or not w.d_up or r.tn or r.tc >= c.max_turns:
        return NOT_ENABLED
    held = r.st == RUNNING and r.d == WRITABLE
    if r.ti != 1 and not held:
        return NOT_ENABLED
    if r.ti != 1 and "two_writers_on_session" not in m:  # the session's turn still decodes
        return refuse("SingleWriter")  # one writer per session
    if not held and "append_after_evict" not in m:  # decode no longer holds the KV
        return refuse("NothingLost")
    return put(w, i, r._replace(tn=ROUTED, tc=r.tc + 1))


def TurnPrefill(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The next turn falls back to prefill: the session's KV is gone from decode (evicted
    between turns) or diverges from the new prompt. Decode's copy, if any, is dropped
    and the whole conversation is computed again (as a retraction's refetch); while
    prefill is down the turn fails instead (``back_to_prefill``)."""
    r = w.reqs[i]
    if not c.turns or r.ti != 1 or r.tn or r.tc >= c.max_turns:
        return NOT_ENABLED
    if r.st not in (RUNNING, PREEMPTED) or (r.d == WRITABLE and not r.tdv):
        return NOT_ENABLED
    nr = back_to_prefill(w, r._replace(ti=0, tdv=0, tc=r.tc + 1))  # fails: prefill down
    if r.d == WRITABLE:
        return _free(w, i, nr) if w.d_up else NOT_ENABLED
    return put(w, i, nr)


def DecodeTurnCut(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Cut the divergent tail: the append starts at the longest common token-id prefix."""
    r = w.reqs[i]
    if not c.turns or not w.d_up or r.tn != ROUTED or not r.tdv or r.d != WRITABLE:
        return NOT_ENABLED
    return put(w, i, r._replace(tdv=0))


def DecodeAppend(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Prefill the turn's new tokens on decode, onto the session's KV (the one writer).
    A turn whose request has ended meanwhile is dropped and the pin released."""
    r = w.reqs[i]
    if not c.turns or not w.d_up or r.tn != ROUTED:
        return NOT_ENABLED
    if r.st != RUNNING:
        return put(w, i, r._replace(tn=0, ti=0))
    if r.tdv and "append_divergent_uncut" not in m:
        return refuse("ContentIdentity")  # a tail the prompt does not share: cut it first
    if r.d != WRITABLE:
        return refuse("NothingLost")
    return put(w, i, r._replace(tn=APPENDING))


def DecodeAppendCommit(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The append is complete: the pin is released and the turn decodes (a request that
    ended meanwhile commits nothing; its blocks are freed by its end)."""
    r = w.reqs[i]
    if not c.turns or not w.d_up or r.tn != APPENDING:
        return NOT_ENABLED
    return put(w, i, r._replace(tn=0, ti=0))


def SessionEvict(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Decode evicts an idle session's KV between turns (memory pressure): the request
    is marked preempted, so its next turn is prefilled (failed while prefill is down:
    ``back_to_prefill``). Never while pinned."""
    r = w.reqs[i]
    if not c.turns or not w.d_up or r.ti != 1 or r.d != WRITABLE or r.st != RUNNING:
        return NOT_ENABLED
    if session_pinned(r) and "evict_pinned_session" not in m:
        return refuse("NothingLost")
    return _free(w, i, back_to_prefill(w, r._replace(tdv=0)))  # fails while prefill is down


# -- the state parts of the properties (spec/properties.py) --------------------------


def turns_kept(w: World, c: Config) -> bool:
    """NothingLost: a turn routed to decode has the session's KV there (writable) until
    its append commits."""
    return all(not (r.tn and r.d != WRITABLE) for r in w.reqs)


def turns_single_writer(w: World, c: Config) -> bool:
    """SingleWriter: an append never writes while the session's previous turn decodes."""
    return all(not (r.tn == APPENDING and r.ti == 0) for r in w.reqs)


def turns_identity(w: World, c: Config) -> bool:
    """ContentIdentity: a held session KV with a tail the prompt does not share is
    neither appended to nor decoded on (it waits, between turns, for the cut)."""
    for r in w.reqs:
        if r.tdv and r.d in (COMPLETE, WRITABLE):
            if r.tn == APPENDING or (r.st == RUNNING and r.ti == 0):
                return False
    return True


# -- the inductive invariant's conjuncts (spec/INVARIANTS.md, spec/invariants) --------------
def turn_idle(w: World, c: Config) -> bool:
    """``TurnIdle``: the turn fields in range (all 0 without ``turns``); a session between
    turns (``ti``, ``tn`` or ``tdv`` set) ended its handoff (no source, the sender idle,
    no host copy), decodes nothing (no decode step in flight) and holds decode's KV
    writable or not at all; a routed turn is between turns, with the KV (``turns_kept``);
    an appending one has no divergent tail; a divergent tail outlives its turn only on an
    ended request."""
    if not turns_kept(w, c):  # a routed turn has the session's KV (NothingLost's part)
        return False
    for r in w.reqs:
        if not (0 <= r.tn <= APPENDING and 0 <= r.ti <= 1 and 0 <= r.tdv <= 1):
            return False
        if not 0 <= r.tc <= c.max_turns or (r.tc and not c.turns):
            return False
        if not (r.ti or r.tn or r.tdv):
            continue
        if not c.turns or r.p != NONE or r.ps != IDLE or r.h != NONE or r.dstep:
            return False
        if r.d not in (NONE, WRITABLE) or (r.tn and not r.ti) or (r.tn == APPENDING and r.tdv):
            return False
        if r.tdv and not r.ti and r.st not in ENDED:
            return False
    return True


def turn_quiet(w: World, c: Config) -> bool:
    """``TurnQuiet``: a session between turns has no message in flight (its turn ended
    with none, and nothing sends one until the next turn is prefilled)."""
    return all(not (r.ti or r.tn or r.tdv) for r in w.reqs for _ in r.net)
