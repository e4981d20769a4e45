"""z3 mirror of ``spec/actions_prefill.py``: one function per action, same names.

Each function reads ``x`` (a ``Ctx``), ``r`` (the acting request's view) and ``a`` (the
consumed message, or None) and lists the Python function's returns in order
(``Rules.no``: not enabled or refused, naming the property; ``Rules.go``: the changed
fields). Keep the two files side by side when editing either.
"""

from __future__ import annotations

from model_checks.symbolic.behaviours.async_steps import busy_free, busy_freeze, busy_preempt
from model_checks.symbolic.behaviours.irrevocable import writes_drained
from model_checks.symbolic.behaviours.retract import refetch_epoch
from model_checks.symbolic.core import EQ, IN, RV, A, Ctx, Msg, N, NetOp, O, Rules, Z
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    ENDED,
    FAILED,
    FILLING,
    FINISHED,
    G_END_FAILED,
    G_FROZEN_WRITE,
    IDLE,
    M_ACK,
    M_CHUNK,
    M_CHUNK_UNSTAGED,
    M_DONE,
    M_HANDOFF,
    M_NACK,
    M_QUIESCED,
    M_READY,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUEUED,
    RUNNING,
    SENDING,
    WRITABLE,
)


def timeouts_allowed(x: Ctx) -> Z:
    return x.admit_possible() if "sweep_only_on_admit" in x.m else True


def _kind(a: Msg | None) -> int:
    return a.kind if a is not None else -1


def PrefillAdmit(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillAdmit")
    R.no(O(N(x.p_up), N(IN(r.st, (QUEUED, PREEMPTED))), r.p != NONE, r.h != NONE))
    R.no(x.used_p() + c.blocks > c.cap_p, "CapacityRefcount")
    R.go(st=PREFILLING, p=WRITABLE)
    return R


def PrefillRun(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillRun")
    R.no(O(x.c.async_steps, N(x.p_up), r.st != PREFILLING, r.p != WRITABLE))
    R.go(st=RUNNING)
    return R


def PrefillDecodeStep(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillDecodeStep")
    R.no(O(x.c.async_steps, N(x.p_up), r.st != RUNNING))
    R.go(A(r.p == WRITABLE, r.ps == IDLE))  # a self-loop
    frozen = A(r.p == COMPLETE, O(r.ps != IDLE, r.h == FILLING))
    if "source_writes_while_frozen" in x.m:
        R.go(frozen, g=r.g | G_FROZEN_WRITE)
    else:
        R.no(frozen, "FrozenSnapshot")
    R.no(True)
    return R


def PrefillFinish(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillFinish")
    R.no(O(N(x.p_up), r.st != RUNNING, r.p != WRITABLE, r.ps != IDLE, r.h != NONE))
    R.no(busy_free(x, r, "p"), "NoReuseUnderIO")
    R.go(st=FINISHED, p=NONE)
    return R


def PrefillPreempt(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillPreempt")
    R.no(O(N(c.recompute), N(x.p_up), r.st != RUNNING, r.ps != IDLE, r.mv >= c.max_moves))
    writable = A(r.p == WRITABLE, r.h == NONE)
    R.no(A(writable, busy_preempt(x, r)), "NoReuseUnderIO")
    R.go(writable, st=PREEMPTED, p=NONE, mv=r.mv + 1)
    under_io = A(r.p == COMPLETE, r.h == FILLING)
    if "preempt_during_store" in x.m:
        R.go(under_io, st=PREEMPTED, p=NONE, mv=r.mv + 1)
    else:
        R.no(under_io, "NoReuseUnderIO")
    R.no(True)
    return R


def PrefillOffloadBegin(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillOffloadBegin")
    R.no(O(N(c.offload), N(x.p_up), r.st != RUNNING, r.p != WRITABLE, r.ps != IDLE))
    R.no(O(r.h != NONE, r.mv >= c.max_moves))
    R.no(x.used_h() + c.blocks > c.cap_h, "CapacityRefcount")
    R.no(busy_freeze(x, r), "FrozenSnapshot")
    R.go(p=COMPLETE, h=FILLING, hl=0, mv=r.mv + 1)
    return R


def PrefillOffloadCopy(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillOffloadCopy")
    R.no(O(N(x.p_up), r.st != RUNNING, r.h != FILLING, r.p != COMPLETE, r.hl >= c.blocks))
    R.go(hl=r.hl + 1)
    return R


def PrefillOffloadCommit(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillOffloadCommit")
    R.no(O(N(x.p_up), r.st != RUNNING, r.h != FILLING, r.p != COMPLETE))
    R.no(r.hl != c.blocks, "PublishAfterCommit")
    R.go(h=COMPLETE, p=NONE)
    return R


def PrefillReloadBegin(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillReloadBegin")
    R.no(O(N(c.offload), N(x.p_up), r.st != RUNNING))
    storing = A(r.h == FILLING, r.p == COMPLETE)
    if "reload_during_store" in x.m:
        R.go(storing, p=FILLING, gl=0)
    else:
        R.no(storing, "LoadXorStore")
    R.no(O(r.h != COMPLETE, r.p != NONE))
    R.no(x.used_p() + c.blocks > c.cap_p, "CapacityRefcount")
    R.go(p=FILLING, gl=0)
    return R


def PrefillReloadCopy(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillReloadCopy")
    R.no(O(N(x.p_up), r.st != RUNNING, r.p != FILLING, r.gl >= c.blocks))
    R.go(gl=r.gl + 1)
    return R


def PrefillReloadCommit(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillReloadCommit")
    R.no(O(N(x.p_up), r.st != RUNNING, r.p != FILLING))
    R.no(r.gl != c.blocks, "NoPartialUse")
    R.go(r.h == COMPLETE, p=WRITABLE, gl=0, h=NONE, hl=0)
    R.go(p=WRITABLE, gl=0)
    return R


def PrefillFreeze(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("PrefillFreeze")
    R.no(O(N(c.handoff), N(x.p_up), r.st != RUNNING, r.p != WRITABLE, r.ps != IDLE))
    R.no(O(r.h != NONE, r.ep >= c.max_attempts))
    R.no(busy_freeze(x, r), "FrozenSnapshot")
    e = refetch_epoch(x, r)
    send = NetOp("send", M_HANDOFF, e, 0)
    R.go(net=[send], p=COMPLETE, ep=e, ps=AWAIT_READY, sent=0, phit=0, stg=0)
    return R


def PrefillRecvReady(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillRecvReady")
    R.no(O(N(x.p_up), _kind(a) != M_READY, r.st != RUNNING, r.ps != AWAIT_READY))
    assert a is not None
    R.no(a.e != r.ep, "Fencing")
    R.go(net=[NetOp("take", a.kind, a.e, a.i)], ps=SENDING, sent=0, phit=a.i)
    return R


def PrefillSendChunk(x: Ctx, r: RV, a: Msg | None) -> Rules:
    """Rank-major: ``rank, pos = divmod(sent, per_rank + 1)``, split by rank (src_tp is
    concrete, so every term stays linear). Outside ``0 <= sent < total`` (never reached:
    see INVARIANTS.md, TypeOK) no branch applies."""
    c, R = x.c, Rules("PrefillSendChunk")
    R.no(O(N(x.p_up), r.st != RUNNING, r.ps != SENDING))
    per_rank = c.blocks - r.phit
    q = per_rank + 1
    total = c.src_tp * q
    if "zero_block_never_done" in x.m:
        R.go(EQ(per_rank, 0), ps=AWAIT_ACK, sent=total)
    sent = r.sent + 1
    for rank in range(c.src_tp):
        in_rank = A(rank * q <= r.sent, r.sent < (rank + 1) * q)
        pos = r.sent - rank * q
        staged = O(N(c.identity), r.phit + pos < r.stg)  # identity.staged
        idx = rank * per_rank + pos
        items = [(A(pos < per_rank, staged), NetOp("send", M_CHUNK, r.ep, idx))]
        if "unstaged_block_advertised" in x.m:
            items.append((pos < per_rank, NetOp("send", M_CHUNK_UNSTAGED, r.ep, idx)))
        else:
            R.no(A(in_rank, pos < per_rank, N(staged)), "ContentIdentity")
        items.append((True, NetOp("send", M_DONE, r.ep, rank)))
        for is_item, op in items:
            at = A(in_rank, is_item)
            R.go(A(at, sent < total), net=[op], sent=sent)
            if "release_before_install" in x.m:
                R.go(at, net=[op], ps=IDLE, sent=0, phit=0, p=NONE)
            else:
                R.go(at, net=[op], sent=sent, ps=AWAIT_ACK)
    R.no(True)
    return R


def PrefillRelease(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillRelease")
    R.no(O(N(x.p_up), _kind(a) != M_ACK, r.ps != AWAIT_ACK, r.p != COMPLETE))
    assert a is not None
    R.no(a.e != r.ep, "Fencing")
    if "release_keeps_wait" in x.m:
        R.go(net=[NetOp("take", a.kind, a.e, a.i)], p=NONE)
        return R
    R.go(net=[NetOp("take", a.kind, a.e, a.i)], p=NONE, ps=IDLE, sent=0, phit=0)
    return R


def PrefillResume(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillResume")
    R.no(O(N(x.p_up), _kind(a) != M_NACK, r.st != RUNNING, r.ps == IDLE))
    assert a is not None
    R.no(a.e != r.ep, "Fencing")
    R.no(N(writes_drained(x, r, r.ep)), "FrozenSnapshot")
    quiesced = NetOp("send", M_QUIESCED, r.ep, 0, when=N(x.c.revocable))
    R.go(net=[NetOp("take", a.kind, a.e, a.i), quiesced], p=WRITABLE, ps=IDLE, sent=0, phit=0)
    return R


def PrefillTimeout(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillTimeout")
    R.no(O(N(x.p_up), r.ps == IDLE, N(timeouts_allowed(x))))
    R.no(A(N(x.c.revocable), N(writes_drained(x, r, r.ep))), "NoReuseUnderIO")
    drop = NetOp("drop", e=r.ep)
    flush = [NetOp("drop", e=r.ep, when=x.c.revocable), NetOp("send", M_QUIESCED, r.ep, 0)]
    R.go(r.st != RUNNING, net=flush, p=NONE, h=NONE, ps=IDLE, sent=0, phit=0)
    if "source_resumes_on_timeout" in x.m:
        R.go(net=[drop], p=WRITABLE, ps=IDLE, sent=0, phit=0)
    R.go(net=flush, st=FAILED, g=r.g | G_END_FAILED, p=NONE, ps=IDLE, sent=0, phit=0)
    return R


def PrefillQuiesce(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillQuiesce")
    R.no(O(N(x.p_up), N(IN(r.st, ENDED))))
    R.no(A(r.p == NONE, r.h == NONE, r.ps == IDLE))
    R.no(A(r.ps != IDLE, N(writes_drained(x, r, r.ep))), "NoReuseUnderIO")
    R.no(busy_free(x, r, "p"), "NoReuseUnderIO")
    send = NetOp("send", M_QUIESCED, r.ep, 0, when=r.ps != IDLE)
    R.go(net=[send], p=NONE, h=NONE, hl=0, gl=0, ps=IDLE, sent=0, phit=0)
    return R


def prefill_msg_stale(r: RV, a: Msg) -> Z:
    """``actions_prefill.prefill_msg_stale`` on a message of concrete kind."""
    old = O(a.e != r.ep, IN(r.st, ENDED), r.ps == IDLE)
    if a.kind == M_READY:
        return O(old, r.ps != AWAIT_READY)
    if a.kind == M_ACK:
        return O(old, r.ps != AWAIT_ACK)
    return old


def PrefillDiscard(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("PrefillDiscard")
    R.no(O(N(x.p_up), N(_kind(a) in (M_READY, M_ACK, M_NACK))))
    assert a is not None
    R.no(N(prefill_msg_stale(r, a)))
    R.go(net=[NetOp("take", a.kind, a.e, a.i)])
    return R


def PrefillStage(x: Ctx, r: RV, a: Msg | None) -> Rules:
    """``spec/behaviours/identity.py``: stage the next block of the frozen snapshot."""
    c, R = x.c, Rules("PrefillStage")
    R.no(O(N(c.identity), N(x.p_up), r.st != RUNNING, r.p != COMPLETE))
    R.no(O(N(IN(r.ps, (AWAIT_READY, SENDING))), r.stg >= c.blocks))
    R.go(stg=r.stg + 1)
    return R
