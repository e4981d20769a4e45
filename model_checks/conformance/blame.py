"""Which properties a refused or deviating event breaks, most specific first.

The spec's guards name a property when they refuse (``Refused.prop``). A guard that
only says "not enabled" is judged here, from the state the engine acted in:

- **StickyEnd**: a step that makes progress on a request that has ended (finished,
  cancelled or failed): a validate after an abort, a step after finish, and so on;
- **Fencing**: a step of a crashed worker, or a message of another attempt;
- **CapacityRefcount**: a step that frees a side's blocks where the request holds none
  there (a double free: the ids it frees are free, or another request's), or one that
  allocates a side's blocks where the request already holds some (the first set leaks);
- **the engine's state**: the event's *unguarded effect* (what the engine did anyway:
  freed the source on a release without an Ack, freed decode's blocks on aborting a
  healthy attempt, wrote blocks it does not hold) is applied to the request and the
  state is judged against every safety property.

Which sides a step frees or allocates and what it writes is not listed here: it is the
spec's own, derived from its actions' traced paths (``effects.TABLE``).

Nothing in this module decides what the spec allows: it runs only after the spec has
refused, to name the law the engine broke. When no property is broken the verdict is
``UNMODELLED``: the engine did something the spec has no word for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from model_checks.conformance.effects import TABLE as EFFECTS
from spec.behaviours.restarts import older_incarnation
from spec.config import Config
from spec.properties import violated_safety
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    CHUNKS,
    COMPLETE,
    DF_FENCED,
    ENDED,
    FILLING,
    IDLE,
    M_CHUNK_UNSTAGED,
    M_DONE,
    M_READY,
    NONE,
    PREFILLING,
    QUARANTINED,
    RESERVED,
    WRITABLE,
    Req,
    World,
    msg_epoch,
    msg_idx,
    msg_kind,
)

UNMODELLED = "Unmodelled"
# Most specific first: a law about one kind of I/O or message before the laws about
# any copy or any block (NothingLost would otherwise hide NoReuseUnderIO).
SPECIFICITY = (
    "FrozenSnapshot",
    "Fencing",
    "NoReuseUnderIO",
    "LoadXorStore",
    "PublishAfterCommit",
    "ManifestGate",
    "ContentIdentity",
    "NoPartialUse",
    "RankAgreement",
    "StickyEnd",
    "SingleWriter",
    "CapacityRefcount",
    "NothingLost",
    "BoundedExit",
    "NoDeadlock",
)
_HELD_FOR_WRITES = (RESERVED, FILLING, QUARANTINED)
_RANK = {p: k for k, p in enumerate(SPECIFICITY)}

# Steps that make progress on a live request (after its end, StickyEnd refuses them).
_PROGRESS = frozenset(
    {
        "PrefillRun",
        "PrefillDecodeStep",
        "PrefillFinish",
        "PrefillOffloadBegin",
        "PrefillOffloadCopy",
        "PrefillOffloadCommit",
        "PrefillReloadBegin",
        "PrefillReloadCopy",
        "PrefillReloadCommit",
        "PrefillFreeze",
        "PrefillRecvReady",
        "PrefillSendChunk",
        "PrefillResume",
        "DecodeReserve",
        "DecodeValidate",
        "DecodeCommit",
        "DecodeStep",
        "DecodeFinish",
        "PrefillStepDispatch",
        "DecodeStepDispatch",
    }
)


def ordered(props: Iterable[str]) -> list[str]:
    """Distinct property IDs, most specific first (unknown IDs last, in given order)."""
    seen: dict[str, None] = dict.fromkeys(props)
    return sorted(seen, key=lambda p: _RANK.get(p, len(_RANK)))


# A token step writes its replica (the KV it appends is not in the spec's state, so the
# spec's step changes no field): the replica it writes must be the one writable copy.
_TOKEN_WRITE = {"PrefillDecodeStep": "p", "DecodeStep": "d"}


def _chunks(r: Req) -> bool:
    return any(msg_kind(x) in CHUNKS for x in r.net)


def _unguarded(r: Req, name: str) -> Req | None:
    """The event's unguarded effect on its request: what the engine did, whatever the
    guard said (``effects``: the spec's own writes of the action; None: no write)."""
    side = _TOKEN_WRITE.get(name)
    fx = EFFECTS.get(name)
    writes: dict[str, Any] = {side: WRITABLE} if side is not None else {}
    if fx is not None and not writes and not any(getattr(r, s) != NONE for s in fx.allocs):
        writes = dict(fx.writes)  # (an allocation over held blocks leaks: _pool_props)
    return r._replace(**writes) if writes else None


def _order_props(r: Req, name: str, arg: int, msg: bool) -> list[str]:
    """A step taken out of the protocol's order, named by the law the order protects."""
    out: list[str] = []
    if name in ("PrefillRun", "PrefillDecodeStep") and r.p == NONE:
        out.append("NoReuseUnderIO")  # computes KV into blocks it never allocated
    if name == "PrefillOffloadCopy" and r.h == NONE:
        out.append("NoReuseUnderIO")  # copies into host blocks not allocated for it
    if name == "PrefillReloadCopy" and r.p == NONE:
        out.append("NoReuseUnderIO")  # copies into GPU blocks not allocated for it
    if name == "PrefillFreeze" and r.st == PREFILLING:
        out.append("NoPartialUse")  # hands off a snapshot whose prefill has not finished
    if name == "PrefillSendChunk" and r.ps == AWAIT_READY:
        out.append("NoReuseUnderIO")  # writes before decode said which blocks it holds
    if name == "PrefillSendChunk" and r.ps == IDLE and r.p == WRITABLE:
        out.append("FrozenSnapshot")  # sends a source that is still written
    if name == "PrefillSendChunk" and r.ps == AWAIT_ACK and r.dep == r.ep:
        if r.d not in _HELD_FOR_WRITES and not r.dfl & DF_FENCED:
            out.append("NoReuseUnderIO")  # writes past its last item into blocks not held
    if name == "DecodeCommit" and r.d in (RESERVED, FILLING):
        out.append("NoPartialUse")  # installs what was never validated
    if name == "DecodeStep" and r.d == COMPLETE:
        out.append("SingleWriter")  # writes before the commit point made it the writer
    if name == "PrefillResume" and msg and arg not in r.net:
        out.append("SingleWriter")  # thaws the source while the attempt may still commit
    return out


def _pool_props(r: Req, name: str) -> list[str]:
    """A free of blocks the request does not hold, or an allocation on top of blocks it
    holds: the pool's accounting is wrong from this step on."""
    fx = EFFECTS.get(name)
    if fx is None:
        return []
    if fx.frees and all(getattr(r, s) == NONE for s in fx.frees):
        return ["CapacityRefcount"]  # a double free
    if any(getattr(r, s) != NONE for s in fx.allocs):
        return ["CapacityRefcount"]  # allocates again: the blocks it holds leak
    return []


def _effect_props(w: World, c: Config, name: str, i: int) -> list[str]:
    r = w.reqs[i]
    r2 = _unguarded(r, name)
    if r2 is None:
        return []
    out: list[str] = []
    side = _TOKEN_WRITE.get(name)
    if side is not None:
        if getattr(r, side) == NONE:
            return ["NoReuseUnderIO"]  # writes blocks that are free (or reused)
        if side == "p" and r.p == COMPLETE:
            out.append("FrozenSnapshot")
    fx = EFFECTS.get(name)
    if fx is not None and "p" in fx.frees and _chunks(r) and r.p != NONE:
        out.append("NoReuseUnderIO")  # frees a source that writes still read
    w2 = w._replace(reqs=(*w.reqs[:i], r2, *w.reqs[i + 1 :]))
    return out + violated_safety(w2, c)


def _identity_props(w: World, c: Config, r: Req, i: int, arg: int) -> list[str]:
    """Content identity and slots (spec/behaviours): a message the spec never sent that
    only a sender defect, a foreign prefix or a reused slot explains."""
    kind, out = msg_kind(arg), list[str]()
    if arg in r.net:
        return out
    if kind == M_CHUNK_UNSTAGED:
        out.append("ContentIdentity")  # a chunk its sender never staged: the sender's fault
    if kind == M_READY and msg_idx(arg) > 0 and w.pfx and not w.pfx_ok:
        out.append("ContentIdentity")  # decode counted recycled prefix blocks as a hit
    if kind == M_DONE and c.slots:
        late = any(j != i and o.sl == 0 and arg in o.net for j, o in enumerate(w.reqs))
        if late:
            out.append("Fencing")  # another request's late notification, by its slot
    return out


def blame(w: World, c: Config, name: str, actor: str, i: int, arg: int, msg: bool) -> list[str]:
    """Properties an event the spec does not enable breaks in ``w``: the guard's (ended
    request, crashed worker, other attempt) first, then those of the engine's state,
    each most specific first (empty: none; the caller reports UNMODELLED)."""
    props: list[str] = []
    if (actor == "P" and not w.p_up) or (actor == "D" and not w.d_up):
        props.append("Fencing")  # a crashed worker acts: nothing fenced it off
    r = w.reqs[i] if actor != "env" or msg else None
    if r is not None:
        if name in _PROGRESS and r.st in ENDED:
            props.append("StickyEnd")
        if msg:
            e = msg_epoch(arg)
            mine = r.dep if actor == "D" else r.ep
            if e != mine and name != "DecodeReserve":
                props.append("Fencing")  # a message of another attempt moves the state
            if msg_kind(arg) in CHUNKS and arg not in r.net:
                if not (r.dep == e and r.d in _HELD_FOR_WRITES):
                    props.append("NoReuseUnderIO")  # a write no one holds blocks for lands
        props.extend(_identity_props(w, c, r, i, arg) if msg else [])
        props.extend(_order_props(r, name, arg, msg))
        props.extend(_pool_props(r, name))
        return ordered(props) + [p for p in ordered(_effect_props(w, c, name, i)) if p not in props]
    return ordered(props)


def blame_state(w: World, c: Config) -> list[str]:
    """Safety properties a state breaks, most specific first."""
    return ordered(violated_safety(w, c))


def blame_observed(pre: World, eng: World, c: Config, arg: int, msg: bool) -> list[str]:
    """An observed effect the spec's step lacks, of an event that consumed a message of an
    older incarnation (spec/behaviours/restarts.py): the spec fences it (it changes
    nothing), the engine moved on it. A write of a dead registration that lands is
    NoReuseUnderIO first (it writes blocks of the new pool), any other message Fencing;
    then the laws the engine's state breaks."""
    if not (msg and c.restarts and older_incarnation(pre, arg)):
        return blame_state(eng, c)
    first = ["NoReuseUnderIO", "Fencing"] if msg_kind(arg) in CHUNKS else ["Fencing"]
    return first + [p for p in blame_state(eng, c) if p not in first]
