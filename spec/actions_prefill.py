"""Actions of the scheduler / prefill worker (actor ``P``).

Each action is ``Name(w, c, m, i, arg) -> World | Refused`` with an explicit frame:
only the fields named in ``_replace`` change. ``i`` is the request slot, ``arg`` the
message code for actions that consume a message (0 otherwise), ``m`` the mutants on.
"""

from __future__ import annotations

from spec.behaviours.async_steps import (
    step_blocks_free,
    step_blocks_freeze,
    step_blocks_preempt,
)
from spec.behaviours.host_cache import host_quiesce
from spec.behaviours.identity import staged
from spec.behaviours.irrevocable import writes_drained
from spec.behaviours.restarts import fenced
from spec.behaviours.retract import refetch_reuses_epoch
from spec.common import (
    NOT_ENABLED,
    Mutants,
    Result,
    drop_chunks,
    put,
    refuse,
    send,
    sent_blocks,
    take,
    timeouts_allowed,
    used_h,
    used_p,
)
from spec.config import Config
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
    World,
    msg,
    msg_epoch,
    msg_idx,
    msg_inc,
    msg_kind,
)
from spec.stream.layers import layers_given, stream_resume
from spec.window import window_whole


def PrefillAdmit(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.p_up or r.st not in (QUEUED, PREEMPTED) or r.p != NONE or r.h != NONE:
        return NOT_ENABLED
    if r.hk or (c.host_cache and w.hc == COMPLETE):  # a host-cache hit is loaded instead
        return NOT_ENABLED
    if r.ti:  # a session evicted between turns: its next turn comes first (TurnPrefill)
        return NOT_ENABLED
    if used_p(w, c) + c.blocks > c.cap_p:
        return refuse("CapacityRefcount")
    return put(w, i, r._replace(st=PREFILLING, p=WRITABLE, pw=0))  # pw: a whole copy


def PrefillRun(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if c.async_steps or not w.p_up or r.st != PREFILLING or r.p != WRITABLE:
        return NOT_ENABLED
    return put(w, i, r._replace(st=RUNNING))


def PrefillDecodeStep(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Append one token's KV to the writable replica (abstractly: a self-loop)."""
    r = w.reqs[i]
    if c.async_steps or not w.p_up or r.st != RUNNING:
        return NOT_ENABLED
    if r.p == WRITABLE and r.ps == IDLE:
        return w
    if r.p == COMPLETE and (r.ps != IDLE or r.h == FILLING):
        if "source_writes_while_frozen" in m:
            return put(w, i, r._replace(g=r.g | G_FROZEN_WRITE))
        return refuse("FrozenSnapshot")
    return NOT_ENABLED


def PrefillFinish(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.p_up or r.st != RUNNING or r.p != WRITABLE or r.ps != IDLE or r.h != NONE:
        return NOT_ENABLED
    if (busy := step_blocks_free(c, r, "p", m)) is not None:
        return busy
    return put(w, i, r._replace(st=FINISHED, p=NONE))


def PrefillPreempt(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Recompute preemption: drop the KV on purpose; the request is prefilled again later."""
    r = w.reqs[i]
    if not c.recompute or not w.p_up or r.st != RUNNING or r.ps != IDLE or r.mv >= c.max_moves:
        return NOT_ENABLED
    if r.p == WRITABLE and r.h == NONE:
        if (busy := step_blocks_preempt(c, r, m)) is not None:
            return busy
        return put(w, i, r._replace(st=PREEMPTED, p=NONE, mv=r.mv + 1))
    if r.p == COMPLETE and r.h == FILLING:  # an offload is still reading these blocks
        if "preempt_during_store" in m:
            return put(w, i, r._replace(st=PREEMPTED, p=NONE, mv=r.mv + 1))
        return refuse("NoReuseUnderIO")
    return NOT_ENABLED


def PrefillOffloadBegin(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not c.offload or not w.p_up or r.st != RUNNING or r.p != WRITABLE or r.ps != IDLE:
        return NOT_ENABLED
    if r.h != NONE or r.mv >= c.max_moves or not window_whole(r):
        return NOT_ENABLED
    if used_h(w, c) + c.blocks > c.cap_h:
        return refuse("CapacityRefcount")
    if (busy := step_blocks_freeze(c, r, m)) is not None:
        return busy
    return put(w, i, r._replace(p=COMPLETE, h=FILLING, hl=0, mv=r.mv + 1))


def PrefillOffloadCopy(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.p_up or r.st != RUNNING or r.h != FILLING or r.p != COMPLETE or r.hl >= c.blocks:
        return NOT_ENABLED
    return put(w, i, r._replace(hl=r.hl + 1))


def PrefillOffloadCommit(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The store completed: publish the host copy, then free the GPU blocks."""
    r = w.reqs[i]
    if not w.p_up or r.st != RUNNING or r.h != FILLING or r.p != COMPLETE:
        return NOT_ENABLED
    if r.hl != c.blocks:
        return refuse("PublishAfterCommit")
    return put(w, i, r._replace(h=COMPLETE, p=NONE))


def PrefillReloadBegin(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not c.offload or not w.p_up or r.st != RUNNING:
        return NOT_ENABLED
    if r.h == FILLING and r.p == COMPLETE:  # a store of this request is in flight
        if "reload_during_store" in m:
            return put(w, i, r._replace(p=FILLING, gl=0))
        return refuse("LoadXorStore")
    if r.h != COMPLETE or r.p != NONE:
        return NOT_ENABLED
    if used_p(w, c) + c.blocks > c.cap_p:
        return refuse("CapacityRefcount")
    return put(w, i, r._replace(p=FILLING, gl=0))


def PrefillReloadCopy(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.p_up or r.st != RUNNING or r.p != FILLING or r.gl >= c.blocks:
        return NOT_ENABLED
    return put(w, i, r._replace(gl=r.gl + 1))


def PrefillReloadCommit(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.p_up or r.st != RUNNING or r.p != FILLING:
        return NOT_ENABLED
    if r.gl != c.blocks:
        return refuse("NoPartialUse")
    if r.h == COMPLETE:
        return put(w, i, r._replace(p=WRITABLE, gl=0, h=NONE, hl=0))
    return put(w, i, r._replace(p=WRITABLE, gl=0))


def PrefillFreeze(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Freeze the snapshot (read-only from now on), open epoch ep+1, send the manifest."""
    r = w.reqs[i]
    if not c.handoff or not w.p_up or r.st != RUNNING or r.p != WRITABLE or r.ps != IDLE:
        return NOT_ENABLED
    if r.h != NONE or r.ep >= c.max_attempts or not window_whole(r):
        return NOT_ENABLED
    if (busy := step_blocks_freeze(c, r, m)) is not None:
        return busy
    e = r.ep + 1
    if refetch_reuses_epoch(r, m):  # the retract_keeps_epoch bug: a refetch re-opens ep
        e = r.ep
    net = send(w, r.net, msg(M_HANDOFF, e))
    return put(w, i, r._replace(p=COMPLETE, ep=e, ps=AWAIT_READY, sent=0, phit=0, net=net, stg=0))


def PrefillRecvReady(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.p_up or msg_kind(arg) != M_READY or r.st != RUNNING or r.ps != AWAIT_READY:
        return NOT_ENABLED
    if msg_epoch(arg) != r.ep or fenced(w, c, m, arg):
        return refuse("Fencing")
    r2 = r._replace(ps=SENDING, sent=0, phit=msg_idx(arg), net=take(r.net, arg))
    return put(w, i, r2._replace(rinc=msg_inc(arg)) if c.restarts else r2)


def PrefillSendChunk(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Send the next item, rank-major: a rank's chunks, then that rank's RankDone."""
    r = w.reqs[i]
    if not w.p_up or r.st != RUNNING or r.ps != SENDING:
        return NOT_ENABLED
    if not layers_given(c, r):  # a streamed offer: a chunk leaves once its layers are known
        return NOT_ENABLED
    per_rank = sent_blocks(c, r.phit)
    total = c.src_tp * (per_rank + 1)
    if per_rank == 0 and "zero_block_never_done" in m:
        return put(w, i, r._replace(ps=AWAIT_ACK, sent=total))
    rank, pos = divmod(r.sent, per_rank + 1)
    if pos < per_rank:
        code = msg(M_CHUNK, r.ep, rank * per_rank + pos, r.rinc)  # to the Ready's pool
        if not staged(c, r.stg, r.phit, pos):  # the block's bytes are not its hash's
            if "unstaged_block_advertised" not in m:
                return refuse("ContentIdentity")
            code = msg(M_CHUNK_UNSTAGED, r.ep, rank * per_rank + pos, r.rinc)
    else:
        code = msg(M_DONE, r.ep, rank)
    net = send(w, r.net, code)
    sent = r.sent + 1
    if sent < total:
        return put(w, i, r._replace(sent=sent, net=net))
    if "release_before_install" in m:  # frees the source as soon as its sends complete
        return put(w, i, r._replace(net=net, ps=IDLE, sent=0, phit=0, p=NONE))
    return put(w, i, r._replace(sent=sent, net=net, ps=AWAIT_ACK))


def PrefillRelease(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Decode's Ack: the commit point has passed, so the source blocks are freed."""
    r = w.reqs[i]
    if not w.p_up or msg_kind(arg) != M_ACK or r.ps != AWAIT_ACK or r.p != COMPLETE:
        return NOT_ENABLED
    if msg_epoch(arg) != r.ep or fenced(w, c, m, arg):
        return refuse("Fencing")
    if "release_keeps_wait" in m:  # the bug: frees the source, the sender still waits
        return put(w, i, r._replace(p=NONE, net=take(r.net, arg)))
    return put(w, i, r._replace(p=NONE, ps=IDLE, sent=0, phit=0, net=take(r.net, arg)))


def PrefillResume(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Decode's Nack: this epoch never commits, so the source may be written again."""
    r = w.reqs[i]
    if not w.p_up or msg_kind(arg) != M_NACK or r.st != RUNNING or r.ps == IDLE:
        return NOT_ENABLED
    if msg_epoch(arg) != r.ep or fenced(w, c, m, arg):
        return refuse("Fencing")
    if not writes_drained(r, r.ep, m):  # its own writes still read the snapshot
        return refuse("FrozenSnapshot")
    net = take(r.net, arg)
    if not c.revocable:  # decode could not fence: it holds the blocks until told
        net = send(w, net, msg(M_QUIESCED, r.ep))
    if r.fs:  # a streamed offer that gave its source back: nothing to thaw
        return stream_resume(w, i, net)
    return put(w, i, r._replace(p=WRITABLE, ps=IDLE, sent=0, phit=0, net=net))


def PrefillTimeout(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Bounded exit without decode's word: flush own writes (they fail), free the
    source, tell decode the writer has quiesced; a running request fails closed."""
    r = w.reqs[i]
    if not w.p_up or r.ps == IDLE or not timeouts_allowed(w, c, m):
        return NOT_ENABLED
    if not c.revocable and not writes_drained(r, r.ep, m):  # no flush: wait for the batch
        return refuse("NoReuseUnderIO")
    flushed = drop_chunks(r.net, r.ep) if c.revocable else r.net
    net = send(w, flushed, msg(M_QUIESCED, r.ep))
    if r.st != RUNNING:
        return put(w, i, r._replace(p=NONE, h=NONE, ps=IDLE, sent=0, phit=0, net=net))
    if "source_resumes_on_timeout" in m:
        return put(
            w, i, r._replace(p=WRITABLE, ps=IDLE, sent=0, phit=0, net=drop_chunks(r.net, r.ep))
        )
    return put(
        w, i, r._replace(st=FAILED, g=r.g | G_END_FAILED, p=NONE, ps=IDLE, sent=0, phit=0, net=net)
    )


def PrefillQuiesce(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """An ended request: stop local copies, wait for own writes, free, tell decode."""
    r = w.reqs[i]
    if not w.p_up or r.st not in ENDED:
        return NOT_ENABLED
    if r.p == NONE and r.h == NONE and r.ps == IDLE and not r.hk:
        return NOT_ENABLED
    if r.ps != IDLE and not writes_drained(r, r.ep, m):
        return refuse("NoReuseUnderIO")
    if (busy := step_blocks_free(c, r, "p", m)) is not None:
        return busy
    w2 = host_quiesce(w, i)  # its host-cache pin goes; a store it feeds must end first
    if not isinstance(w2, World):
        return w2
    net = send(w, r.net, msg(M_QUIESCED, r.ep)) if r.ps != IDLE else r.net
    r = w2.reqs[i]
    return put(w2, i, r._replace(p=NONE, h=NONE, hl=0, gl=0, ps=IDLE, sent=0, phit=0, net=net))


def prefill_msg_stale(r_st: int, ps: int, ep: int, code: int) -> bool:
    """A message to prefill that no prefill action will ever use."""
    kind = msg_kind(code)
    if msg_epoch(code) != ep or r_st in ENDED or ps == IDLE:
        return True
    if kind == M_READY:
        return ps != AWAIT_READY
    if kind == M_ACK:
        return ps != AWAIT_ACK
    return False  # a Nack of the current epoch for a live attempt: PrefillResume uses it


def PrefillDiscard(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not w.p_up or msg_kind(arg) not in (M_READY, M_ACK, M_NACK):
        return NOT_ENABLED
    if not prefill_msg_stale(r.st, r.ps, r.ep, arg) and not fenced(w, c, m, arg):
        return NOT_ENABLED
    return put(w, i, r._replace(net=take(r.net, arg)))
