"""The strengthening conjuncts of spec/INVARIANTS.md, one predicate each over a ``World``.

These are the only definition: the z3 proof (``model_checks/symbolic/invariants.py``)
traces each of them on symbolic state. A ``request`` conjunct must hold for every
request, a ``slot`` conjunct for every message slot ``(epoch, idx)`` of every request (a
slot with no message in flight and no landed chunk satisfies each of them, so only the
messages in flight and the landed chunks are visited), a ``global`` one once. So that
the tracer can split them by scope, a predicate is a conjunction over the requests, and
a slot conjunct over the request's messages (``_slots``: decoded with spec.state's
``msg_*``, counted with ``msg``) and its landed chunks (spec.common's ``landed_*``).

The predicates read the control fields (status, replicas, sender phase, epochs) first,
so ``model_checks/explicit/verdicts`` can settle most of them from its key alone.
"""

from __future__ import annotations

from spec.common import landed_at, landed_chunks
from spec.config import Config
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    CANCELLED,
    COMPLETE,
    DF_FAILED,
    DF_FENCED,
    DF_UNSTAGED,
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
    Req,
    World,
    msg,
    msg_epoch,
    msg_idx,
    msg_kind,
)

LIVE_D = (RESERVED, FILLING, COMPLETE, WRITABLE)  # decode has not given the attempt up
HELD_D = (RESERVED, FILLING, QUARANTINED)  # a writer may still land bytes there
LIVE_ST = (QUEUED, PREFILLING, RUNNING, PREEMPTED)
_KINDS = frozenset((*range(1, 10), M_CHUNK_UNSTAGED))
_CHUNK_KINDS = (M_CHUNK, M_CHUNK_BAD, M_CHUNK_UNSTAGED)
_FROM_DECODE = (M_READY, M_ACK, M_NACK)


# -- helpers -------------------------------------------------------------------------------
def _pr(c: Config, r: Req) -> int:
    """Blocks per source rank the attempt sends."""
    return c.blocks - r.phit


def _seq_below(c: Config, r: Req, i: int, bound: int) -> bool:
    """Chunk ``i`` of the current attempt is an item sent before position ``bound``."""
    pr = _pr(c, r)
    return any(k * pr <= i < (k + 1) * pr and i + k < bound for k in range(c.src_tp))


def _fenced(r: Req) -> bool:
    return bool(r.dfl & DF_FENCED)


def _retracted(c: Config, r: Req) -> bool:
    """Decode retracted the committed copy of the current attempt (retract worlds)."""
    return c.retract and r.mv >= 1 and r.d == NONE and not _fenced(r) and r.dep == r.ep


def _slots(r: Req) -> list[tuple[int, int, int]]:
    """(kind, epoch, idx) of each message in flight."""
    return [(msg_kind(code), msg_epoch(code), msg_idx(code)) for code in r.net]


def _count(r: Req, kind: int, e: int, i: int) -> int:
    return r.net.count(msg(kind, e, i))


# -- request conjuncts ----------------------------------------------------------------------
def _type_ok_req(c: Config, r: Req) -> bool:
    total = c.src_tp * (_pr(c, r) + 1)
    return (
        QUEUED <= r.st <= FAILED
        and 0 <= r.p <= 5
        and 0 <= r.d <= 5
        and 0 <= r.h <= 5
        and 0 <= r.ps <= 3
        and 0 <= r.dep <= r.ep <= c.max_attempts
        and 0 <= r.phit <= c.blocks
        and 0 <= r.hit <= c.blocks
        and (r.d != NONE or r.hit == 0)
        and 0 <= r.hl <= c.blocks
        and 0 <= r.gl <= c.blocks
        and r.mv >= 0
        and r.sent >= 0
        and (r.ps != SENDING or r.sent < total)
    )


def type_ok(w: World, c: Config) -> bool:
    return all(_type_ok_req(c, r) for r in w.reqs)


def frozen(w: World, c: Config) -> bool:
    for r in w.reqs:
        if r.ps == IDLE:
            continue
        if r.p != COMPLETE or r.h != NONE or r.ep < 1 or r.st in (QUEUED, PREFILLING):
            return False
        if r.st == PREEMPTED and not _retracted(c, r):
            return False
    return True


def decode_epoch(w: World, c: Config) -> bool:
    return all(r.d == NONE or r.dep >= 1 for r in w.reqs)


def decode_current(w: World, c: Config) -> bool:
    return all(r.d not in LIVE_D or r.dep == r.ep for r in w.reqs)


def decode_live_source(w: World, c: Config) -> bool:
    for r in w.reqs:
        if r.d not in LIVE_D:
            continue
        if r.p not in (NONE, COMPLETE) or (r.p == COMPLETE and r.ps == IDLE) or r.h != NONE:
            return False
        if r.st not in (RUNNING, CANCELLED, FAILED) or _fenced(r):
            return False
    return True


def idle_seen(w: World, c: Config) -> bool:
    return all(r.ps != IDLE or r.st not in LIVE_ST or not w.p_up or r.dep >= r.ep for r in w.reqs)


def same_hit(w: World, c: Config) -> bool:
    return all(
        r.ps not in (SENDING, AWAIT_ACK) or r.d == NONE or r.dep != r.ep or r.phit == r.hit
        for r in w.reqs
    )


def _home(w: World, c: Config, r: Req) -> bool:
    """Decode holds the attempt's blocks, or fenced it on a revocable transport, or is down."""
    return r.d in HELD_D or (c.revocable and _fenced(r)) or not w.d_up


def chunks_have_home(w: World, c: Config) -> bool:
    for r in w.reqs:
        if r.ps != SENDING:
            continue
        pr = _pr(c, r)
        if pr > 0 and r.sent < c.src_tp * (pr + 1) - 1:
            if r.dep != r.ep or not _home(w, c, r):
                return False
    return True


def failed_needs_switch(w: World, c: Config) -> bool:
    return c.decode_failure or all(not r.dfl & DF_FAILED for r in w.reqs)


def down_empty(w: World, c: Config) -> bool:
    """A crashed worker holds nothing: its GPU and host memory are gone (EnvCrash frees
    every replica there, and nothing allocates on a worker that is down)."""
    for r in w.reqs:
        if not w.p_up and (r.p != NONE or r.h != NONE):
            return False
        if not w.d_up and r.d != NONE:
            return False
    return True


def step_held(w: World, c: Config) -> bool:
    for r in w.reqs:
        if r.pstep not in (0, 1) or r.dstep not in (0, 1):
            return False
        if not c.async_steps and (r.pstep or r.dstep):
            return False
        if r.pstep and not (r.p == WRITABLE and r.ps == IDLE and w.p_up):
            return False
        if r.dstep and not (r.d == WRITABLE and w.d_up):
            return False
    return True


def staged_only(w: World, c: Config) -> bool:
    return all(not r.dfl & DF_UNSTAGED for r in w.reqs)


def prefix_own(w: World, c: Config) -> bool:
    return w.pfx_ok


# -- slot conjuncts: each message in flight (and each landed chunk) ---------------------------
def _idx_ok(c: Config, kind: int, i: int) -> bool:
    if kind == M_READY:
        return i in (0, c.prefix)
    if kind in _CHUNK_KINDS:
        return 0 <= i < c.src_tp * c.blocks
    if kind == M_DONE:
        return 0 <= i < c.src_tp
    return i == 0


def msg_ok(w: World, c: Config) -> bool:
    for r in w.reqs:
        for kind, e, i in _slots(r):
            if kind not in _KINDS or not 1 <= e <= r.ep or not _idx_ok(c, kind, i):
                return False
            if kind in _FROM_DECODE and e > r.dep:
                return False
    return True


def handoff_fresh(w: World, c: Config) -> bool:
    for r in w.reqs:
        for kind, e, _ in _slots(r):
            if kind not in (M_HANDOFF, M_HANDOFF_BAD) or e <= r.dep:
                continue
            waiting = r.ps == AWAIT_READY and r.p == COMPLETE
            gone = r.ps == IDLE and r.p == NONE
            if e != r.ep or r.h != NONE or not (waiting or gone):
                return False
    return True


def ready_matches(w: World, c: Config) -> bool:
    for r in w.reqs:
        for kind, e, i in _slots(r):
            if kind != M_READY:
                continue
            if e == r.dep and r.d != NONE and i != r.hit:
                return False
            waiting = e == r.ep and r.ps == AWAIT_READY and i < c.blocks
            if waiting and (r.dep != e or not _home(w, c, r)):
                return False
    return True


def nack_gave_up(w: World, c: Config) -> bool:
    for r in w.reqs:
        for kind, e, _ in _slots(r):
            if kind == M_NACK and e == r.dep and r.d in LIVE_D:
                return False
    return True


def _ack_retracted(c: Config, r: Req, e: int) -> bool:
    """An Ack whose committed copy decode retracted (retract worlds)."""
    again = e == r.ep and _retracted(c, r) and (r.ps == IDLE or r.st == PREEMPTED)
    return c.retract and r.mv >= 1 and (e < r.ep or again)


def ack_committed(w: World, c: Config) -> bool:
    for r in w.reqs:
        for kind, e, _ in _slots(r):
            if kind != M_ACK:
                continue
            committed = (
                e == r.ep == r.dep
                and r.d in (WRITABLE, NONE)
                and not _fenced(r)
                and r.st not in (QUEUED, PREFILLING, PREEMPTED)
                and (r.st != RUNNING or r.d == WRITABLE)
            )
            if not committed and not _ack_retracted(c, r, e):
                return False
    return True


def quiesced_stopped(w: World, c: Config) -> bool:
    for r in w.reqs:
        for kind, e, _ in _slots(r):
            if kind == M_QUIESCED and r.ps != IDLE and r.ep == e:
                return False
    return True


def chunk_once(w: World, c: Config) -> bool:
    for r in w.reqs:
        for kind, e, i in _slots(r):
            if kind not in (M_CHUNK, M_CHUNK_BAD):
                continue
            if _count(r, M_CHUNK, e, i) + _count(r, M_CHUNK_BAD, e, i) > 1:
                return False
            if not 0 <= i < c.src_tp * _pr(c, r):
                return False
            if e == r.dep and r.d in HELD_D and landed_at(r, i):
                return False
            if not (r.ps == AWAIT_ACK or (r.ps == SENDING and _seq_below(c, r, i, r.sent))):
                return False
    return True


def landed_sent(w: World, c: Config) -> bool:
    for r in w.reqs:
        if r.ps == IDLE or r.dep != r.ep or r.d not in HELD_D:
            continue
        for i in landed_chunks(r):
            if r.ps == AWAIT_READY or (r.ps == SENDING and not _seq_below(c, r, i, r.sent)):
                return False
    return True


def no_unstaged(w: World, c: Config) -> bool:
    return all(kind != M_CHUNK_UNSTAGED for r in w.reqs for kind, _, _ in _slots(r))


__all__ = [
    "ack_committed",
    "chunk_once",
    "chunks_have_home",
    "decode_current",
    "decode_epoch",
    "decode_live_source",
    "down_empty",
    "failed_needs_switch",
    "frozen",
    "handoff_fresh",
    "idle_seen",
    "landed_sent",
    "msg_ok",
    "nack_gave_up",
    "no_unstaged",
    "prefix_own",
    "quiesced_stopped",
    "ready_matches",
    "same_hit",
    "staged_only",
    "step_held",
    "type_ok",
]
