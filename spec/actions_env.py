"""Actions of the environment (faults, within the config's budget) and of the client.

Faults: lose any message; duplicate a control message (one-sided data writes are
never duplicated: a retried write is a new write with the same epoch, which the model
covers by loss + resend of a new attempt); corrupt a chunk (its checksum will not
match); swap the manifest for one the decode side cannot accept; crash a worker (its
GPU and host contents, its in-flight writes and the messages to it are gone); fail a
store to host. Reordering is free: the network is a multiset.
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Result, add, put, take
from spec.config import Config
from spec.state import (
    CANCELLED,
    CHUNKS,
    COMPLETE,
    FAILED,
    FILLING,
    G_END_CANCELLED,
    G_END_FAILED,
    IDLE,
    M_CHUNK,
    M_CHUNK_BAD,
    M_HANDOFF,
    M_HANDOFF_BAD,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUEUED,
    RUNNING,
    TO_DECODE,
    TO_PREFILL,
    WRITABLE,
    Req,
    World,
    msg,
    msg_epoch,
    msg_idx,
    msg_inc,
    msg_kind,
)

LIVE = (QUEUED, PREFILLING, RUNNING, PREEMPTED)


def _fault(w: World, c: Config, kind: str) -> bool:
    return kind in c.fault_kinds and w.faults < c.faults


def EnvLose(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    if not _fault(w, c, "lose"):
        return NOT_ENABLED
    r = w.reqs[i]
    return put(w, i, r._replace(net=take(r.net, arg)))._replace(faults=w.faults + 1)


def EnvDuplicate(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    if not _fault(w, c, "duplicate") or msg_kind(arg) in CHUNKS:
        return NOT_ENABLED
    r = w.reqs[i]
    return put(w, i, r._replace(net=add(r.net, arg)))._replace(faults=w.faults + 1)


def EnvCorrupt(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    if not _fault(w, c, "corrupt") or msg_kind(arg) != M_CHUNK:
        return NOT_ENABLED
    r = w.reqs[i]
    bad = msg(M_CHUNK_BAD, msg_epoch(arg), msg_idx(arg), msg_inc(arg))
    net = add(take(r.net, arg), bad)
    return put(w, i, r._replace(net=net))._replace(faults=w.faults + 1)


def EnvManifestMismatch(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The decode side's model/adapter/dtype/RoPE/layout differs from the manifest's."""
    if not _fault(w, c, "mismatch") or msg_kind(arg) != M_HANDOFF:
        return NOT_ENABLED
    r = w.reqs[i]
    bad = msg(M_HANDOFF_BAD, msg_epoch(arg), msg_idx(arg), msg_inc(arg))
    net = add(take(r.net, arg), bad)
    return put(w, i, r._replace(net=net))._replace(faults=w.faults + 1)


def EnvStoreFail(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """A store to host fails: its copy must never become visible; the GPU copy thaws."""
    r = w.reqs[i]
    if not _fault(w, c, "store_fail") or r.h != FILLING or r.p != COMPLETE:
        return NOT_ENABLED
    if "failed_store_visible" in m:
        r2 = r._replace(h=COMPLETE, p=NONE)
    else:
        r2 = r._replace(h=NONE, hl=0, p=WRITABLE)
    return put(w, i, r2)._replace(faults=w.faults + 1)


def _lost_with_prefill(r: Req) -> Req:
    """After a prefill crash: a live request fails unless decode holds a validated copy."""
    if r.st in LIVE and r.d not in (COMPLETE, WRITABLE):
        return r._replace(st=FAILED, g=r.g | G_END_FAILED)
    return r


def back_to_prefill(w: World, r: Req) -> Req:
    """``r`` (decode's copy dropped: evicted, retracted, or its turn sent back) handed to
    prefill, preempted, to be computed again; while prefill is down nothing can compute
    it, so it fails, as the crash fails every such request (``_lost_with_prefill``). Its
    copy on decode is the caller's to free (``_free``), so ``d`` and its ranks stay as
    they are here (RankAgreement's ``dmask`` goes with ``d``)."""
    r = r._replace(st=PREEMPTED)
    return r if w.p_up else r._replace(st=FAILED, g=r.g | G_END_FAILED)


def _lost_with_decode(r: Req, d_before: int) -> Req:
    """After a decode crash: a live request fails when decode owned it (committed), or
    when it is running and its only complete copy was on decode. A request that needs no
    copy yet (queued, prefilling, preempted) keeps its status: prefill still serves it
    (SPEC.md, "Crash fates")."""
    if r.st in LIVE and (
        d_before == WRITABLE
        or (r.st == RUNNING and r.p not in (COMPLETE, WRITABLE) and r.h != COMPLETE)
    ):
        return r._replace(st=FAILED, g=r.g | G_END_FAILED)
    return r


def EnvCrash(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Crash worker ``arg`` (0: prefill, 1: decode) for good."""
    if not _fault(w, c, "crash"):
        return NOT_ENABLED
    if arg == 0 and w.p_up:
        reqs = tuple(
            _lost_with_prefill(
                r._replace(
                    p=NONE,
                    h=NONE,
                    hl=0,
                    gl=0,
                    ps=IDLE,
                    sent=0,
                    phit=0,
                    pstep=0,
                    hk=0,
                    net=tuple(
                        x for x in r.net if msg_kind(x) not in CHUNKS and msg_kind(x) in TO_DECODE
                    ),
                )
            )
            for r in w.reqs
        )
        w = w._replace(hc=NONE, hc_hl=0, hc_pin=0, hc_late=0, hc_bad=False)  # host memory
        return w._replace(reqs=reqs, p_up=False, faults=w.faults + 1)
    if arg == 1 and w.d_up:
        reqs = tuple(
            _lost_with_decode(
                r._replace(
                    d=NONE,
                    hit=0,
                    landed=0,
                    rmask=0,
                    rcnt=0,
                    dfl=0,
                    dstep=0,
                    dmask=0,
                    sl=0,
                    tn=0,
                    ti=0,
                    tdv=0,
                    net=tuple(x for x in r.net if msg_kind(x) in TO_PREFILL),
                ),
                r.d,
            )
            for r in w.reqs
        )
        return w._replace(reqs=reqs, d_up=False, pfx=False, pfx_ref=0, faults=w.faults + 1)
    return NOT_ENABLED


def ClientCancel(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not c.cancel or r.st not in (QUEUED, PREFILLING, RUNNING, PREEMPTED):
        return NOT_ENABLED
    return put(w, i, r._replace(st=CANCELLED, g=r.g | G_END_CANCELLED))
