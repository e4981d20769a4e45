"""Actions of the decode worker (actor ``D``). Same signature as actions_prefill."""

from __future__ import annotations

from spec.behaviours.async_steps import step_blocks_free
from spec.behaviours.decode_failure import attempt_failed
from spec.behaviours.decode_ranks import ranks_installed
from spec.behaviours.identity import prefix_hit
from spec.behaviours.irrevocable import fence, may_fence, quarantine_over
from spec.behaviours.restarts import fenced
from spec.behaviours.slots import resolve_by_slot, slot_free, slot_taken
from spec.common import (
    NOT_ENABLED,
    Mutants,
    Result,
    full_chunks,
    full_ranks,
    put,
    refuse,
    send,
    take,
    timeouts_allowed,
    used_d,
)
from spec.config import Config
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
    G_FOREIGN,
    G_POSTEND,
    G_STALE,
    M_ACK,
    M_CHUNK_BAD,
    M_CHUNK_UNSTAGED,
    M_DONE,
    M_HANDOFF,
    M_HANDOFF_BAD,
    M_NACK,
    M_QUIESCED,
    M_READY,
    NONE,
    QUARANTINED,
    RESERVED,
    RUNNING,
    WRITABLE,
    Req,
    World,
    msg,
    msg_epoch,
    msg_idx,
    msg_kind,
)
from spec.stream.layers import layers_installed

_WAITING = (RESERVED, FILLING)


def _free(w: World, i: int, r: Req) -> World:
    """Free decode's replica of request i (``r``: its record with the other changes made);
    drop its prefix reference if it holds one."""
    ref = w.pfx_ref - (1 if r.hit else 0)
    w = put(w, i, r._replace(d=NONE, hit=0, landed=0, rmask=0, rcnt=0, dmask=0, sl=0))
    return w._replace(pfx_ref=ref) if ref != w.pfx_ref else w


def DecodeReserve(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Pre-allocate the blocks the handoff will write (only the missing suffix)."""
    r = w.reqs[i]
    kind = msg_kind(arg)
    if not w.d_up or kind not in (M_HANDOFF, M_HANDOFF_BAD) or r.d != NONE or r.st != RUNNING:
        return NOT_ENABLED
    e = msg_epoch(arg)
    if e <= r.dep or fenced(w, c, m, arg):
        return refuse("Fencing")
    hit = prefix_hit(w, c, m)
    if used_d(w, c) + c.blocks - hit > c.cap_d or not slot_free(w, c):
        return refuse("CapacityRefcount")
    dfl = DF_MISMATCH if kind == M_HANDOFF_BAD else 0
    net = send(w, take(r.net, arg), msg(M_READY, e, hit))
    r2 = r._replace(
        d=RESERVED, dep=e, hit=hit, landed=0, rmask=0, rcnt=0, dfl=dfl, net=net, sl=slot_taken(c)
    )
    w2 = put(w, i, r2)
    return w2._replace(pfx_ref=w.pfx_ref + 1) if hit else w2


def DecodeReject(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """No room, the request has ended, or an incompatible manifest refused at intake
    (before anything is reserved; ``DecodeReserve`` may instead reserve it and let
    validation refuse it): refuse the attempt with a Nack."""
    r = w.reqs[i]
    kind = msg_kind(arg)
    if not w.d_up or kind not in (M_HANDOFF, M_HANDOFF_BAD) or r.d != NONE:
        return NOT_ENABLED
    e = msg_epoch(arg)
    if e <= r.dep or fenced(w, c, m, arg):
        return NOT_ENABLED
    hit = prefix_hit(w, c, m)
    room = used_d(w, c) + c.blocks - hit <= c.cap_d and slot_free(w, c)
    if r.st == RUNNING and room and kind != M_HANDOFF_BAD:
        return NOT_ENABLED
    net = send(w, take(r.net, arg), msg(M_NACK, e))
    if "reject_unfenced" in m:  # the rejected epoch stays fresh: a copy of it may reserve
        return put(w, i, r._replace(dfl=0, net=net))
    return put(w, i, r._replace(dep=e, dfl=0, net=net))


def DecodeReceiveChunk(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """A one-sided write lands: it goes wherever the attempt's blocks are, held or not."""
    r = w.reqs[i]
    kind = msg_kind(arg)
    if not w.d_up or kind not in CHUNKS:
        return NOT_ENABLED
    net = take(r.net, arg)
    e = msg_epoch(arg)
    if e == r.dep and r.dfl & DF_FENCED and c.revocable:  # fails at the fenced connection
        return put(w, i, r._replace(net=net))
    if fenced(w, c, m, arg):  # it targets a dead incarnation's registration: it fails
        return put(w, i, r._replace(net=net))
    if e == r.dep and r.d in (RESERVED, FILLING, QUARANTINED):
        dfl = r.dfl | (DF_CORRUPT if kind == M_CHUNK_BAD else 0)
        dfl |= DF_UNSTAGED if kind == M_CHUNK_UNSTAGED else 0
        d = FILLING if r.d == RESERVED else r.d
        return put(w, i, r._replace(d=d, landed=r.landed | (1 << msg_idx(arg)), dfl=dfl, net=net))
    return put(w, i, r._replace(g=r.g | G_FOREIGN, net=net))  # lands in blocks not held


def DecodeReceiveDone(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.d_up or msg_kind(arg) != M_DONE or r.d not in _WAITING:
        return resolve_by_slot(w, c, m, i, arg) if w.d_up and c.slots else NOT_ENABLED
    bit = 1 << msg_idx(arg)
    rcnt = r.rcnt + 1 if "duplicate_rank_counted" in m else 0
    if fenced(w, c, m, arg):
        return refuse("Fencing")
    if msg_epoch(arg) != r.dep:
        if "stale_epoch_accepted" not in m:
            return refuse("Fencing")
        r = r._replace(g=r.g | G_STALE)
    return put(w, i, r._replace(rmask=r.rmask | bit, rcnt=rcnt, net=take(r.net, arg)))


def DecodeValidate(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Manifest, checksums, every rank: only then is the replica complete (read-only)."""
    r = w.reqs[i]
    if not w.d_up or r.d not in _WAITING:
        return NOT_ENABLED
    g = r.g
    if r.st != RUNNING:
        if r.st != CANCELLED or "cancel_ignored" not in m:
            return refuse("StickyEnd")
        g |= G_POSTEND
    if attempt_failed(c, r) and "validate_after_decode_failure" not in m:
        return refuse("StickyEnd")  # decode failed this attempt itself
    if "duplicate_rank_counted" in m:
        if r.rcnt < c.src_tp:
            return refuse("RankAgreement")
    elif r.rmask != full_ranks(c):
        return refuse("RankAgreement")
    if "partial_as_complete" not in m:
        if r.landed != full_chunks(c, r.hit) or r.dfl & DF_CORRUPT:
            return refuse("NoPartialUse")
    if not layers_installed(c, r):  # a streamed replica: every layer out of staging
        return refuse("NoPartialUse")
    if r.dfl & DF_MISMATCH and "mismatch_installed" not in m:
        return refuse("ManifestGate")
    return put(w, i, r._replace(d=COMPLETE, g=g))


def DecodeCommit(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The commit point: decode becomes the one writer and tells prefill (Ack)."""
    r = w.reqs[i]
    if not w.d_up or r.d != COMPLETE:
        return NOT_ENABLED
    if attempt_failed(c, r) and "validate_after_decode_failure" not in m:
        return refuse("StickyEnd")
    if not ranks_installed(r.dmask, c, m):  # every decode rank has its shard
        return refuse("RankAgreement")
    net = send(w, r.net, msg(M_ACK, r.dep))
    if r.st == RUNNING:
        return put(w, i, r._replace(d=WRITABLE, net=net))
    if r.st == FAILED and "error_overwritten" in m:
        return put(w, i, r._replace(d=WRITABLE, st=RUNNING, net=net))
    if r.st == CANCELLED and "cancel_ignored" in m:
        return put(w, i, r._replace(d=WRITABLE, g=r.g | G_POSTEND, net=net))
    return refuse("StickyEnd")


def DecodeStep(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if w.d_up and attempt_failed(c, r) and r.d != NONE and "validate_after_decode_failure" not in m:
        return refuse("StickyEnd")  # a step of an attempt decode has failed
    if c.async_steps or not w.d_up or r.d != WRITABLE or r.st != RUNNING:
        return NOT_ENABLED
    if r.ti or r.tn:  # between turns nothing decodes (spec/behaviours/turns.py)
        return NOT_ENABLED
    return w


def DecodeFinish(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.d_up or r.d != WRITABLE or r.st != RUNNING or r.tn:  # tn: a pinned session
        return NOT_ENABLED
    if (busy := step_blocks_free(c, r, "d", m)) is not None:
        return busy
    return _free(w, i, r._replace(st=FINISHED))


def DecodeAbort(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Give the attempt up (cancelled, failed, or it failed validation). While a writer
    may still land bytes, a cancelled attempt's blocks are quarantined until it quiesces;
    an invalid attempt of a running request is fenced (its writes fail) and freed."""
    r = w.reqs[i]
    if not w.d_up or r.d in (NONE, QUARANTINED) or r.tn:  # tn: a pinned session
        return NOT_ENABLED
    invalid = r.d in _WAITING and r.dfl & (DF_CORRUPT | DF_MISMATCH | DF_FAILED)
    if r.st == RUNNING and not invalid:
        return NOT_ENABLED
    if (busy := step_blocks_free(c, r, "d", m)) is not None:
        return busy
    net = r.net if r.d == WRITABLE else send(w, r.net, msg(M_NACK, r.dep))
    if r.d in _WAITING and r.landed != full_chunks(c, r.hit):  # a writer may still land
        if invalid and r.st == RUNNING and may_fence(c, m):  # fence its writes, free now
            return _free(w, i, r._replace(dfl=r.dfl | DF_FENCED, net=fence(c, net, r.dep)))
        if invalid and r.st == RUNNING:  # no revoke: quarantined while a write may land
            return put(w, i, r._replace(d=QUARANTINED, net=net))
        if "free_on_cancel_in_flight" in m:
            return _free(w, i, r._replace(net=net))
        return put(w, i, r._replace(d=QUARANTINED, net=net))
    return _free(w, i, r._replace(net=net))


def DecodeAbortFenced(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Give up a cancelled or failed request's attempt while a writer may still land
    bytes, on a transport that revokes writes: fence it (its writes in flight fail) and
    free the blocks at once, instead of ``DecodeAbort``'s quarantine until the writer
    quiesces. Both are correct; an engine (the API's ``Receiver.abort``) does one."""
    r = w.reqs[i]
    if not w.d_up or r.d not in _WAITING or r.tn or r.st == RUNNING or not may_fence(c, m):
        return NOT_ENABLED
    if r.landed == full_chunks(c, r.hit):  # nothing more can land: DecodeAbort frees
        return NOT_ENABLED
    if (busy := step_blocks_free(c, r, "d", m)) is not None:
        return busy
    net = fence(c, send(w, r.net, msg(M_NACK, r.dep)), r.dep)
    return _free(w, i, r._replace(dfl=r.dfl | DF_FENCED, net=net))


def DecodeReclaim(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The writer says it has quiesced (it only does so for an ended request or a
    flushed attempt): the attempt's blocks are free at last."""
    r = w.reqs[i]
    if not w.d_up or msg_kind(arg) != M_QUIESCED or r.d not in (RESERVED, FILLING, QUARANTINED):
        return NOT_ENABLED
    if msg_epoch(arg) != r.dep or fenced(w, c, m, arg):
        return refuse("Fencing")
    if r.d != QUARANTINED and r.st == RUNNING:
        return NOT_ENABLED  # prefill flushed and failed it: DecodeAbort runs first
    return _free(w, i, r._replace(net=take(r.net, arg)))


def DecodeTimeout(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Bounded exit without the peer: fence the attempt's writes, free, Nack."""
    r = w.reqs[i]
    if not w.d_up or r.d not in (RESERVED, FILLING, QUARANTINED):
        return NOT_ENABLED
    if not timeouts_allowed(w, c, m):
        return NOT_ENABLED
    if r.d == FILLING and "no_timeout_while_filling" in m:
        return NOT_ENABLED
    if not may_fence(c, m):  # no revoke: the writes of attempt dep may still land
        if r.d == QUARANTINED:  # the second, longer timeout: past every write's lifetime
            return _free(w, i, r) if quarantine_over(r) else NOT_ENABLED
        if r.landed != full_chunks(c, r.hit):
            return put(w, i, r._replace(d=QUARANTINED, net=send(w, r.net, msg(M_NACK, r.dep))))
    net = fence(c, r.net, r.dep)
    if r.d != QUARANTINED:
        net = send(w, net, msg(M_NACK, r.dep))
    return _free(w, i, r._replace(dfl=r.dfl | DF_FENCED, net=net))


def DecodeEvictPrefix(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Evict the cached shared prefix (only when nobody references it)."""
    if not w.d_up or not w.pfx:
        return NOT_ENABLED
    if w.pfx_ref > 0 and "evict_referenced_prefix" not in m:
        return refuse("CapacityRefcount")
    return w._replace(pfx=False)


def decode_msg_stale(r: Req, code: int) -> bool:
    """A control message to decode that no decode action will ever use."""
    kind = msg_kind(code)
    e = msg_epoch(code)
    if kind in (M_HANDOFF, M_HANDOFF_BAD):
        return e <= r.dep
    if kind == M_DONE:
        return e != r.dep or r.d not in _WAITING
    if kind == M_QUIESCED:
        return e != r.dep or r.d not in (RESERVED, FILLING, QUARANTINED)
    return False


def DecodeDiscard(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.d_up or msg_kind(arg) not in (M_HANDOFF, M_HANDOFF_BAD, M_DONE, M_QUIESCED):
        return NOT_ENABLED
    if not decode_msg_stale(r, arg) and not fenced(w, c, m, arg):
        return NOT_ENABLED
    if msg_kind(arg) == M_DONE and "stale_epoch_accepted" in m and r.d in _WAITING:
        return NOT_ENABLED  # the mutant counts it instead
    return put(w, i, r._replace(net=take(r.net, arg)))
