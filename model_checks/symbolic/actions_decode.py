"""z3 mirror of ``spec/actions_decode.py`` and ``spec/actions_env.py`` (same names).

Conventions as in ``z3_actions_p``. Two actions are not per request:
``DecodeEvictPrefix`` (global: no request view) and ``EnvCrash`` (a worker crash
changes every request the same way: ``Crash`` gives the per-request map).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from model_checks.symbolic.actions_prefill import timeouts_allowed
from model_checks.symbolic.behaviours.async_steps import busy_free
from model_checks.symbolic.behaviours.decode_failure import attempt_failed
from model_checks.symbolic.behaviours.decode_ranks import ranks_installed
from model_checks.symbolic.behaviours.irrevocable import fence, may_fence, quarantine_over
from model_checks.symbolic.core import EQ, IN, ITE, RV, A, Ctx, Msg, N, NetOp, O, Rules, Z, flag
from spec.state import (
    CANCELLED,
    CHUNKS,
    COMPLETE,
    DF_CORRUPT,
    DF_FAILED,
    DF_FENCED,
    DF_MISMATCH,
    DF_UNSTAGED,
    FAILED,
    FILLING,
    FINISHED,
    G_END_CANCELLED,
    G_END_FAILED,
    G_FOREIGN,
    G_POSTEND,
    G_STALE,
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
    TO_DECODE,
    TO_PREFILL,
    WRITABLE,
)

WAITING = (RESERVED, FILLING)
HELD_D = (RESERVED, FILLING, QUARANTINED)
HANDOFFS = (M_HANDOFF, M_HANDOFF_BAD)
LIVE = (QUEUED, PREFILLING, RUNNING, PREEMPTED)


def _kind(a: Msg | None) -> int:
    return a.kind if a is not None else -1


def _take(a: Msg) -> NetOp:
    return NetOp("take", a.kind, a.e, a.i)


def free(x: Ctx, r: RV) -> dict[str, Z]:
    """``actions_decode._free``: the changes that free decode's replica."""
    return {
        "d": NONE,
        "hit": 0,
        "landed": x.lempty(),
        "rmask": x.rzero(),
        "rcnt": 0,
        "dmask": 0,
        "pfx_ref": ITE(EQ(r.hit, 0), x.pfx_ref, x.pfx_ref - 1),
        "sl": 0,
    }


def _hit(x: Ctx) -> Z:
    """``identity.prefix_hit``: the cached prefix counts when its blocks' hash matches."""
    ok = True if "prefix_hash_unchecked" in x.m else x.pfx_ok
    return ITE(A(x.pfx, ok), x.num(x.c.prefix), x.num(0))


def _slot_free(x: Ctx) -> Z:
    """``slots.slot_free``."""
    return True if x.c.slots is False else O(N(x.c.slots), x.slot_free())


def DecodeReserve(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("DecodeReserve")
    R.no(O(N(x.d_up), N(_kind(a) in HANDOFFS), r.d != NONE, r.st != RUNNING))
    assert a is not None
    R.no(a.e <= r.dep, "Fencing")
    hit = _hit(x)
    R.no(O(x.used_d() + c.blocks - hit > c.cap_d, N(_slot_free(x))), "CapacityRefcount")
    dfl = DF_MISMATCH if a.kind == M_HANDOFF_BAD else 0
    net = [_take(a), NetOp("send", M_READY, a.e, hit)]
    ref = ITE(EQ(hit, 0), x.pfx_ref, x.pfx_ref + 1)
    R.go(
        net=net,
        d=RESERVED,
        dep=a.e,
        hit=hit,
        landed=x.lempty(),
        rmask=x.rzero(),
        rcnt=0,
        dfl=dfl,
        pfx_ref=ref,
        sl=ITE(c.slots, 1, 0),
    )
    return R


def DecodeReject(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("DecodeReject")
    R.no(O(N(x.d_up), N(_kind(a) in HANDOFFS), r.d != NONE))
    assert a is not None
    R.no(a.e <= r.dep)
    R.no(A(r.st == RUNNING, x.used_d() + c.blocks - _hit(x) <= c.cap_d, _slot_free(x)))
    dep = r.dep if "reject_unfenced" in x.m else a.e  # the mutant: no fence
    R.go(net=[_take(a), NetOp("send", M_NACK, a.e, 0)], dep=dep, dfl=0)
    return R


def DecodeReceiveChunk(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeReceiveChunk")
    R.no(O(N(x.d_up), N(_kind(a) in CHUNKS)))
    assert a is not None
    net = [_take(a)]
    R.go(A(a.e == r.dep, flag(r.dfl, DF_FENCED), x.c.revocable), net=net)
    dfl = r.dfl | DF_CORRUPT if a.kind == M_CHUNK_BAD else r.dfl
    dfl = dfl | DF_UNSTAGED if a.kind == M_CHUNK_UNSTAGED else dfl
    d = ITE(r.d == RESERVED, FILLING, r.d)
    landed = x.ladd(r.landed, a.i)
    R.go(A(a.e == r.dep, IN(r.d, HELD_D)), net=net, d=d, landed=landed, dfl=dfl)
    R.go(net=net, g=r.g | G_FOREIGN)  # lands in blocks not held
    return R


def DecodeReceiveDone(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeReceiveDone")
    R.no(O(N(x.d_up), _kind(a) != M_DONE, N(IN(r.d, WAITING))))
    assert a is not None
    rcnt = r.rcnt + 1 if "duplicate_rank_counted" in x.m else 0
    g = r.g
    if "stale_epoch_accepted" not in x.m:
        R.no(a.e != r.dep, "Fencing")
    else:
        g = ITE(a.e != r.dep, r.g | G_STALE, r.g)
    R.go(net=[_take(a)], rmask=r.rmask | x.rbit(a.i), rcnt=rcnt, g=g)
    return R


def DecodeValidate(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("DecodeValidate")
    R.no(O(N(x.d_up), N(IN(r.d, WAITING))))
    g = r.g
    if "cancel_ignored" in x.m:
        R.no(A(r.st != RUNNING, r.st != CANCELLED), "StickyEnd")
        g = ITE(r.st != RUNNING, r.g | G_POSTEND, r.g)
    else:
        R.no(r.st != RUNNING, "StickyEnd")
    if "validate_after_decode_failure" not in x.m:
        R.no(attempt_failed(x, r), "StickyEnd")
    if "duplicate_rank_counted" in x.m:
        R.no(r.rcnt < c.src_tp, "RankAgreement")
    else:
        R.no(r.rmask != x.rfull(), "RankAgreement")
    if "partial_as_complete" not in x.m:
        R.no(O(N(x.lfull(r.landed, r.hit)), flag(r.dfl, DF_CORRUPT)), "NoPartialUse")
    if "mismatch_installed" not in x.m:
        R.no(flag(r.dfl, DF_MISMATCH), "ManifestGate")
    R.go(d=COMPLETE, g=g)
    return R


def DecodeCommit(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeCommit")
    R.no(O(N(x.d_up), r.d != COMPLETE))
    if "validate_after_decode_failure" not in x.m:
        R.no(attempt_failed(x, r), "StickyEnd")
    R.no(N(ranks_installed(x, r)), "RankAgreement")
    net = [NetOp("send", M_ACK, r.dep, 0)]
    R.go(r.st == RUNNING, net=net, d=WRITABLE)
    if "error_overwritten" in x.m:
        R.go(r.st == FAILED, net=net, d=WRITABLE, st=RUNNING)
    if "cancel_ignored" in x.m:
        R.go(r.st == CANCELLED, net=net, d=WRITABLE, g=r.g | G_POSTEND)
    R.no(True, "StickyEnd")
    return R


def DecodeStep(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeStep")
    if "validate_after_decode_failure" not in x.m:
        R.no(A(x.d_up, attempt_failed(x, r), r.d != NONE), "StickyEnd")
    R.no(O(x.c.async_steps, N(x.d_up), r.d != WRITABLE, r.st != RUNNING))
    R.go()  # a self-loop
    return R


def DecodeFinish(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeFinish")
    R.no(O(N(x.d_up), r.d != WRITABLE, r.st != RUNNING))
    R.no(busy_free(x, r, "d"), "NoReuseUnderIO")
    R.go(st=FINISHED, **free(x, r))
    return R


def DecodeAbort(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeAbort")
    R.no(O(N(x.d_up), IN(r.d, (NONE, QUARANTINED))))
    bad = O(flag(r.dfl, DF_CORRUPT), flag(r.dfl, DF_MISMATCH), flag(r.dfl, DF_FAILED))
    invalid = A(IN(r.d, WAITING), bad)
    R.no(A(r.st == RUNNING, N(invalid)))
    R.no(busy_free(x, r, "d"), "NoReuseUnderIO")
    net = [NetOp("send", M_NACK, r.dep, 0, when=r.d != WRITABLE)]
    in_flight = A(IN(r.d, WAITING), N(x.lfull(r.landed, r.hit)))  # a writer may still land
    fenced = [*net, fence(x, r.dep)]  # a bad attempt: fence its writes, free now
    bad_running = A(in_flight, invalid, r.st == RUNNING)
    R.go(A(bad_running, may_fence(x)), net=fenced, dfl=r.dfl | DF_FENCED, **free(x, r))
    R.go(bad_running, net=net, d=QUARANTINED)  # no revoke: quarantined while a write may land
    if "free_on_cancel_in_flight" in x.m:
        R.go(in_flight, net=net, **free(x, r))
    else:
        R.go(in_flight, net=net, d=QUARANTINED)
    R.go(net=net, **free(x, r))
    return R


def DecodeReclaim(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeReclaim")
    R.no(O(N(x.d_up), _kind(a) != M_QUIESCED, N(IN(r.d, HELD_D))))
    assert a is not None
    R.no(a.e != r.dep, "Fencing")
    R.no(A(r.d != QUARANTINED, r.st == RUNNING))
    R.go(net=[_take(a)], **free(x, r))
    return R


def DecodeTimeout(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeTimeout")
    R.no(O(N(x.d_up), N(IN(r.d, HELD_D))))
    R.no(N(timeouts_allowed(x)))
    if "no_timeout_while_filling" in x.m:
        R.no(r.d == FILLING)
    mf = may_fence(x)  # no revoke: quarantine; free only once the writer can write no more
    R.go(A(N(mf), r.d == QUARANTINED, quarantine_over(r)), **free(x, r))
    R.no(A(N(mf), r.d == QUARANTINED))
    nack = NetOp("send", M_NACK, r.dep, 0)
    R.go(A(N(mf), N(x.lfull(r.landed, r.hit))), net=[nack], d=QUARANTINED)
    net = [fence(x, r.dep), NetOp("send", M_NACK, r.dep, 0, when=r.d != QUARANTINED)]
    R.go(net=net, dfl=r.dfl | DF_FENCED, **free(x, r))
    return R


def DecodeEvictPrefix(x: Ctx) -> Rules:
    """Global: no request."""
    R = Rules("DecodeEvictPrefix")
    R.no(O(N(x.d_up), N(x.pfx)))
    if "evict_referenced_prefix" not in x.m:
        R.no(x.pfx_ref > 0, "CapacityRefcount")
    R.go(pfx=False)
    return R


def decode_msg_stale(r: RV, a: Msg) -> Z:
    if a.kind in HANDOFFS:
        return a.e <= r.dep
    if a.kind == M_DONE:
        return O(a.e != r.dep, N(IN(r.d, WAITING)))
    if a.kind == M_QUIESCED:
        return O(a.e != r.dep, N(IN(r.d, HELD_D)))
    return False


def DecodeDiscard(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("DecodeDiscard")
    R.no(O(N(x.d_up), N(_kind(a) in (M_HANDOFF, M_HANDOFF_BAD, M_DONE, M_QUIESCED))))
    assert a is not None
    R.no(N(decode_msg_stale(r, a)))
    if a.kind == M_DONE and "stale_epoch_accepted" in x.m:
        R.no(IN(r.d, WAITING))
    R.go(net=[_take(a)])
    return R


# -- environment and client ---------------------------------------------------------------
def fault(x: Ctx, kind: str) -> Z:
    return A(x.c.fault_kinds[kind], x.faults < x.c.faults)


def EnvLose(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("EnvLose")
    R.no(N(fault(x, "lose")))
    assert a is not None
    R.go(net=[_take(a)], faults=x.faults + 1)
    return R


def EnvDuplicate(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("EnvDuplicate")
    R.no(O(N(fault(x, "duplicate")), _kind(a) in CHUNKS))
    assert a is not None
    R.go(net=[NetOp("add", a.kind, a.e, a.i)], faults=x.faults + 1)
    return R


def EnvCorrupt(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("EnvCorrupt")
    R.no(O(N(fault(x, "corrupt")), _kind(a) != M_CHUNK))
    assert a is not None
    net = [_take(a), NetOp("add", M_CHUNK_BAD, a.e, a.i)]
    R.go(net=net, faults=x.faults + 1)
    return R


def EnvManifestMismatch(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("EnvManifestMismatch")
    R.no(O(N(fault(x, "mismatch")), _kind(a) != M_HANDOFF))
    assert a is not None
    net = [_take(a), NetOp("add", M_HANDOFF_BAD, a.e, a.i)]
    R.go(net=net, faults=x.faults + 1)
    return R


def EnvStoreFail(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("EnvStoreFail")
    R.no(O(N(fault(x, "store_fail")), r.h != FILLING, r.p != COMPLETE))
    if "failed_store_visible" in x.m:
        R.go(h=COMPLETE, p=NONE, faults=x.faults + 1)
    else:
        R.go(h=NONE, hl=0, p=WRITABLE, faults=x.faults + 1)
    return R


def ClientCancel(x: Ctx, r: RV, a: Msg | None) -> Rules:
    R = Rules("ClientCancel")
    R.no(O(N(x.c.cancel), N(IN(r.st, LIVE))))
    R.go(st=CANCELLED, g=r.g | G_END_CANCELLED)
    return R


@dataclass
class Crash:
    """``EnvCrash(worker)``: when ``cond``, every request changes by ``per_req`` (its
    messages keep only the kinds in ``keep``) and the globals by ``glob``."""

    cond: Z
    glob: dict[str, Z]
    per_req: Callable[[RV], dict[str, Z]]
    keep: frozenset[int]


_HELD = (COMPLETE, WRITABLE)


def EnvCrash(x: Ctx, worker: int) -> Crash:
    if worker == 0:

        def lost_p(r: RV) -> dict[str, Z]:
            fails = A(IN(r.st, LIVE), N(IN(r.d, _HELD)))
            out = {"p": NONE, "h": NONE, "hl": 0, "gl": 0, "ps": IDLE, "sent": 0, "phit": 0}
            out["pstep"] = 0
            out["st"] = ITE(fails, FAILED, r.st)
            out["g"] = ITE(fails, r.g | G_END_FAILED, r.g)
            return out

        keep = frozenset(k for k in TO_DECODE if k not in CHUNKS)
        cond = A(fault(x, "crash"), x.p_up)
        return Crash(cond, {"p_up": False, "faults": x.faults + 1}, lost_p, keep)

    def lost_d(r: RV) -> dict[str, Z]:
        lost = O(r.d == WRITABLE, A(r.st == RUNNING, N(IN(r.p, _HELD)), r.h != COMPLETE))
        fails = A(IN(r.st, LIVE), lost)  # spec: _lost_with_decode
        out = {"d": NONE, "hit": 0, "landed": x.lempty(), "rmask": x.rzero(), "rcnt": 0}
        out["dfl"] = 0
        out["dstep"] = 0
        out["dmask"] = 0
        out["sl"] = 0
        out["st"] = ITE(fails, FAILED, r.st)
        out["g"] = ITE(fails, r.g | G_END_FAILED, r.g)
        return out

    glob = {"d_up": False, "pfx": False, "pfx_ref": 0, "faults": x.faults + 1}
    return Crash(A(fault(x, "crash"), x.d_up), glob, lost_d, frozenset(TO_PREFILL))
