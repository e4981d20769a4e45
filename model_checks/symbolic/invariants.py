"""The inductive invariant of the spec, conjunct by conjunct (see spec/INVARIANTS.md).

Each ``Conj`` has a scope: ``glob`` (globals and ghost counters), ``req`` (one request:
it must hold for every request) or ``slot`` (one request and one message slot
``(epoch, idx)``: it may read the count of every message kind at that slot, and
``landed[idx]``; it must hold for every slot of every request). The 12 safety
properties are conjuncts themselves (same IDs; a message part is named ``ID.msg``);
``STRENGTHENING`` holds the others. ``SUPPORT`` names, per property, the conjuncts its
proof uses (closed: each is inductive relative to the list).

Notation in the docs: "live" decode replica = reserved, filling, complete or writable
(decode has not given the attempt up); "held" = reserved, filling or quarantined (the
blocks a writer may still land in); ``pr`` = blocks per rank the attempt sends
(blocks - phit); ``seq(i)`` = the position of chunk ``i`` among the sender's items
(``i + rank``, rank-major with one RankDone after each rank's chunks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from model_checks.symbolic.behaviours import identity as I
from model_checks.symbolic.behaviours.async_steps import STEP_HELD_DOC, step_held
from model_checks.symbolic.behaviours.decode_failure import (
    FAILED_NEEDS_SWITCH_DOC,
    failed_needs_switch,
)
from model_checks.symbolic.behaviours.retract import ack_retracted, retracted
from model_checks.symbolic.core import IN, RV, A, Ctx, N, O, Z, flag
from model_checks.symbolic.props import SUPPORT as SUPPORT  # re-exported: the table lives there
from model_checks.symbolic.props import ZPROPS, ZProp
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    CANCELLED,
    CHUNKS,
    COMPLETE,
    DF_FENCED,
    FAILED,
    FILLING,
    IDLE,
    M_ACK,
    M_CHUNK,
    M_CHUNK_BAD,
    M_CHUNK_UNSTAGED,
    M_DONE,
    M_HANDOFF,
    M_HANDOFF_BAD,
    M_NACK,
    M_QUIESCED,
    M_READY,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUARANTINED,
    QUEUED,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
)

ReqFn = Callable[[Ctx, RV], Z]
SlotFn = Callable[[Ctx, RV, Z, Z], Z]  # (ctx, request, epoch, idx)
GlobFn = Callable[[Ctx], Z]

LIVE_D = (RESERVED, FILLING, COMPLETE, WRITABLE)
HELD_D = (RESERVED, FILLING, QUARANTINED)
LIVE_ST = (QUEUED, PREFILLING, RUNNING, PREEMPTED)
KINDS = (*range(1, 10), M_CHUNK_UNSTAGED)


@dataclass(frozen=True)
class Conj:
    name: str
    scope: str  # "glob", "req" or "slot"
    doc: str
    req: ReqFn | None = None
    slot: SlotFn | None = None
    glob: GlobFn | None = None


def _n(r: RV, kind: int, e: Z, i: Z) -> Z:
    return r.net.count(kind, e, i)


def _msg_slot(zp: ZProp) -> SlotFn:
    """``zp``'s scope of one message in flight, for every kind at the slot's epoch and
    index (the kinds whose message changes nothing drop out: ``ZProp.msg_part``)."""

    def slot(x: Ctx, r: RV, e: Z, i: Z) -> Z:
        req, reads = zp.req_reads(x, r)
        if not reads:  # the predicate never looks at the request's messages
            return z3.BoolVal(True)
        parts = ((k, zp.msg_part(x, r, k, e, i, req)) for k in sorted(zp.msg_kinds))
        out = A(*(O(_n(r, k, e, i) <= 0, t) for k, t in parts if t is not None))
        return z3.BoolVal(out) if isinstance(out, bool) else out

    return slot


def _whole_req(zp: ZProp) -> ReqFn:
    """``zp``'s global and per-request scopes, as one conjunct per request."""
    return lambda x, r: A(zp.glob(x), zp.req(x, r))


def from_props() -> dict[str, list[Conj]]:
    """The property conjuncts, by property ID: each property's global and per-request
    scopes, and its per-message one (``ZProp``: all three traced from the spec)."""
    out: dict[str, list[Conj]] = {}
    for pid, zp in ZPROPS.items():
        out[pid] = [
            Conj(pid, "req", zp.id, req=_whole_req(zp)),
            Conj(f"{pid}.msg", "slot", "messages in flight", slot=_msg_slot(zp)),
        ]
    return out


PROPERTY_CONJUNCTS = from_props()


# -- helpers ------------------------------------------------------------------------------
def _pr(x: Ctx, r: RV) -> Z:
    return x.c.blocks - r.phit


def _total(x: Ctx, r: RV) -> Z:
    return x.c.src_tp * (_pr(x, r) + 1)


def _seq_below(x: Ctx, r: RV, i: Z, bound: Z) -> Z:
    """Chunk ``i`` of the current attempt is an item sent before position ``bound``."""
    pr = _pr(x, r)
    return O(*(A(k * pr <= i, i < (k + 1) * pr, i + k < bound) for k in range(x.c.src_tp)))


def _done_below(x: Ctx, r: RV, rank: Z, bound: Z) -> Z:
    """RankDone of ``rank`` is an item sent before position ``bound``."""
    pr = _pr(x, r)
    return O(*(A(rank == k, (k + 1) * (pr + 1) - 1 < bound) for k in range(x.c.src_tp)))


def _chunk(r: RV, e: Z, i: Z) -> Z:
    return O(_n(r, M_CHUNK, e, i) > 0, _n(r, M_CHUNK_BAD, e, i) > 0)


def _any(r: RV, kinds: tuple[int, ...], e: Z, i: Z) -> Z:
    return O(*(_n(r, k, e, i) > 0 for k in kinds))


def _fenced(r: RV) -> Z:
    return flag(r.dfl, DF_FENCED)


def _bit(word: Z, k: int) -> Z:
    return z3.Extract(k, k, word) == 1


def _idx_ok(x: Ctx, kind: int, i: Z) -> Z:
    if kind == M_READY:
        return O(i == 0, i == x.c.prefix)
    if kind in CHUNKS:
        return A(i >= 0, i < x.c.src_tp * x.c.blocks)
    if kind == M_DONE:
        return A(i >= 0, i < x.c.src_tp)
    return i == 0


def _r(name: str, doc: str, fn: ReqFn) -> Conj:
    return Conj(name, "req", doc, req=fn)


def _s(name: str, doc: str, fn: SlotFn) -> Conj:
    return Conj(name, "slot", doc, slot=fn)


# -- the strengthening ----------------------------------------------------------------------
def _type_ok(x: Ctx, r: RV) -> Z:
    c = x.c
    return A(
        r.st >= QUEUED,
        r.st <= FAILED,
        IN(r.p, range(6)),
        IN(r.d, range(6)),
        IN(r.h, range(6)),
        IN(r.ps, range(4)),
        r.ep >= 0,
        r.ep <= c.max_attempts,
        r.dep >= 0,
        r.dep <= r.ep,
        r.phit >= 0,
        r.phit <= c.blocks,
        r.hit >= 0,
        r.hit <= c.blocks,
        O(r.d != NONE, r.hit == 0),
        r.hl >= 0,
        r.hl <= c.blocks,
        r.gl >= 0,
        r.gl <= c.blocks,
        r.mv >= 0,
        r.sent >= 0,
        O(r.ps != SENDING, r.sent < _total(x, r)),
    )


def _msg_ok(x: Ctx, r: RV, e: Z, i: Z) -> Z:
    out = []
    for k in KINDS:
        ok = A(e >= 1, e <= r.ep, _idx_ok(x, k, i))
        if k in (M_READY, M_ACK, M_NACK):  # decode sends them: epochs it has seen
            ok = A(ok, e <= r.dep)
        out.append(A(_n(r, k, e, i) >= 0, O(_n(r, k, e, i) <= 0, ok)))
    return A(*out)


def _handoff_fresh(x: Ctx, r: RV, e: Z, i: Z) -> Z:
    fresh = A(_any(r, (M_HANDOFF, M_HANDOFF_BAD), e, i), e > r.dep)
    frozen = A(r.ps == AWAIT_READY, r.p == COMPLETE)
    gone = A(r.ps == IDLE, r.p == NONE)
    return O(N(fresh), A(e == r.ep, r.h == NONE, O(frozen, gone)))


def _ready(x: Ctx, r: RV, e: Z, i: Z) -> Z:
    ready = _n(r, M_READY, e, i) > 0
    same_hit = O(e != r.dep, r.d == NONE, i == r.hit)
    held = O(IN(r.d, HELD_D), A(_fenced(r), x.c.revocable), N(x.d_up))
    waiting = A(e == r.ep, r.ps == AWAIT_READY, i < x.c.blocks)
    return O(N(ready), A(same_hit, O(N(waiting), A(r.dep == e, held))))


def _chunks(x: Ctx, r: RV, e: Z, i: Z) -> Z:
    in_range = A(i >= 0, i < x.c.src_tp * _pr(x, r))
    not_landed = O(e != r.dep, N(IN(r.d, HELD_D)), N(r.landed[i]))
    sending = O(r.ps == AWAIT_ACK, A(r.ps == SENDING, _seq_below(x, r, i, r.sent)))
    once = _n(r, M_CHUNK, e, i) + _n(r, M_CHUNK_BAD, e, i) <= 1
    return A(once, O(N(_chunk(r, e, i)), A(in_range, not_landed, sending)))


def _landed(x: Ctx, r: RV, e: Z, i: Z) -> Z:
    cur = A(r.landed[i], r.dep == r.ep, IN(r.d, HELD_D), r.ps != IDLE)
    return O(N(cur), A(r.ps != AWAIT_READY, O(r.ps != SENDING, _seq_below(x, r, i, r.sent))))


def _sending(x: Ctx, r: RV) -> Z:
    pr = _pr(x, r)
    chunks_left = A(r.ps == SENDING, pr > 0, r.sent < x.c.src_tp * (pr + 1) - 1)
    fenced = A(_fenced(r), x.c.revocable)  # a fence stops writes only on a revocable transport
    return O(N(chunks_left), A(r.dep == r.ep, O(IN(r.d, HELD_D), fenced, N(x.d_up))))


STRENGTHENING: dict[str, Conj] = {
    c.name: c
    for c in (
        _r(
            "TypeOK",
            "every field in range; decode's epoch is one prefill opened; a free decode"
            " replica has no prefix hit; a sending sender is within its item sequence",
            _type_ok,
        ),
        _s(
            "MsgOK",
            "message counts are never negative; a message in flight has an epoch prefill"
            " opened (and decode saw, for the ones decode sends) and an index in range",
            _msg_ok,
        ),
        _r(
            "Frozen",
            "while prefill hands off (sender not idle) its source is complete (frozen), it"
            " has no host copy, the attempt has an epoch, and the request is past prefill"
            " (preempted only by a retraction after the commit, the Ack not yet taken)",
            lambda x, r: O(
                r.ps == IDLE,
                A(
                    r.p == COMPLETE,
                    r.h == NONE,
                    r.ep >= 1,
                    N(IN(r.st, (QUEUED, PREFILLING))),
                    O(r.st != PREEMPTED, retracted(x, r)),
                ),
            ),
        ),
        _r(
            "DecodeEpoch",
            "a decode replica belongs to an attempt decode has seen (epoch >= 1)",
            lambda x, r: O(r.d == NONE, r.dep >= 1),
        ),
        _r(
            "DecodeCurrent",
            "a live decode replica belongs to prefill's current attempt",
            lambda x, r: O(N(IN(r.d, LIVE_D)), r.dep == r.ep),
        ),
        _r(
            "DecodeLiveSource",
            "while decode's replica is live, prefill's is frozen (sender busy) or gone,"
            " nothing is on host, the request is running or has ended badly, and the"
            " attempt is not fenced",
            lambda x, r: O(
                N(IN(r.d, LIVE_D)),
                A(
                    N(_fenced(r)),
                    IN(r.p, (NONE, COMPLETE)),
                    O(r.p != COMPLETE, r.ps != IDLE),
                    r.h == NONE,
                    IN(r.st, (RUNNING, CANCELLED, FAILED)),
                ),
            ),
        ),
        _r(
            "IdleSeen",
            "an idle sender of a live request on a live prefill has had its last attempt"
            " seen by decode",
            lambda x, r: O(r.ps != IDLE, N(IN(r.st, LIVE_ST)), N(x.p_up), r.dep >= r.ep),
        ),
        _r(
            "SameHit",
            "past Ready, prefill's copy of the prefix hit is decode's",
            lambda x, r: O(
                N(IN(r.ps, (SENDING, AWAIT_ACK))), r.d == NONE, r.dep != r.ep, r.phit == r.hit
            ),
        ),
        _r(
            "ChunksHaveHome",
            "while chunks are still to be sent, decode holds the attempt's blocks or has"
            " fenced it on a revocable transport (or is down)",
            _sending,
        ),
        _r("FailedNeedsSwitch", FAILED_NEEDS_SWITCH_DOC, failed_needs_switch),
        _s(
            "HandoffFresh",
            "a manifest decode has not seen is of prefill's current attempt, whose source"
            " is still frozen awaiting Ready, or gone (request ended or prefill down)",
            _handoff_fresh,
        ),
        _s(
            "ReadyMatches",
            "a Ready carries decode's hit for its epoch; while prefill awaits it (and"
            " there is something to send) decode holds the blocks or has fenced them (on a"
            " revocable transport)",
            _ready,
        ),
        _s(
            "NackGaveUp",
            "a Nack of decode's epoch means decode's replica is not live",
            lambda x, r, e, i: O(_n(r, M_NACK, e, i) <= 0, e != r.dep, N(IN(r.d, LIVE_D))),
        ),
        _s(
            "AckCommitted",
            "an Ack is of the current attempt, the request never went back to the queue,"
            " decode's replica is the (unfenced) writer or gone, and while the request"
            " runs decode is the writer",
            lambda x, r, e, i: O(
                _n(r, M_ACK, e, i) <= 0,
                A(
                    e == r.ep,
                    e == r.dep,
                    IN(r.d, (WRITABLE, NONE)),
                    N(_fenced(r)),
                    N(IN(r.st, (QUEUED, PREFILLING, PREEMPTED))),
                    O(r.st != RUNNING, r.d == WRITABLE),
                ),
                ack_retracted(x, r, e),
            ),
        ),
        _s(
            "QuiescedStopped",
            "a Quiesced of an epoch means prefill no longer sends in that epoch",
            lambda x, r, e, i: O(_n(r, M_QUIESCED, e, i) <= 0, r.ps == IDLE, r.ep != e),
        ),
        _s(
            "ChunkOnce",
            "a chunk is in flight at most once (good or corrupt), in range, not yet"
            " landed in decode's current blocks, and already sent",
            _chunks,
        ),
        _s(
            "LandedSent",
            "a chunk landed in decode's blocks of the current attempt was sent: never"
            " before Ready, and before the sender's position",
            _landed,
        ),
        _r("StepHeld", STEP_HELD_DOC, step_held),
    )
}

# Worlds without staging (identity off: the unbounded model's): behaviours/identity.py.
STRENGTHENING.update((c.name, c) for c in I.conjuncts(Conj))
