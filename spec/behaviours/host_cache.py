"""The host tier as a shared cache: content-keyed copies, pins, publish after commit, a
failed load (issue #22, items 1-3).

Engines keep the host (and disk) tier as a **cache shared by requests**, keyed by the
content (the prefix hash), not as one request's swap space: vLLM's offloading connector
(``OffloadingManager``: ``lookup``, ``prepare_load`` takes a reference that protects the
blocks from eviction, ``complete_load`` drops it; ``prepare_store``, then
``complete_store`` makes them loadable, or removes them when the store failed), LMCache
(lookup pins, ``put`` visible after the store), SGLang HiCache (host pages with a lock
reference, ``exists`` then ``get``), Dynamo KVBM G2-G4, Mooncake Store (``PutStart`` /
``PutEnd`` / ``PutRevoke``). The model keeps one key (the prompt's prefix, every request
shares it): ``World.hc`` is its copy in host memory, ``Req.hk`` a request's role there.

- **Lookup and pin.** ``HostLookup`` reports a hit only for a published (complete) copy
  and pins it (``hc_pin``); the pin lasts until the load completes or fails, so neither
  an eviction between the lookup and the load (SGLang #31108: evicted between ``exists``
  and ``get``) nor one under the load can free the bytes a load reads.
- **Load.** ``HostLoadBegin`` allocates GPU blocks and starts the copy (the request still
  waits, queued: vLLM's WAITING_FOR_REMOTE_KVS); ``HostLoadCopy`` moves one block;
  ``HostLoadCommit`` makes the GPU copy writable once every block is back, and **does
  not consume** the host copy: other requests may hold pins on it.
- **Store and publish.** ``HostStoreBegin`` freezes a running request's blocks and opens
  the copy (``hc`` filling, not visible); ``HostStoreCopy`` writes one block;
  ``HostPublish`` makes the key visible only when every block is in (publish after
  commit) and only for the current attempt. ``HostStoreAbort`` (a timeout) abandons the
  attempt; its writer's completion still comes (``hc_late``). ``HostLateComplete`` takes
  it: a no-op on the key, and the orphan bytes are removed.
- **Delete in two phases.** ``HostEvict`` (memory pressure: a timeout, not a protocol
  step) unpublishes the copy (new lookups miss); ``HostFree`` frees it once its pins
  have drained to zero.
- **A failed load.** ``EnvLoadFail`` (a fault) makes the copy's bytes unreadable
  (``hc_bad``: a host or disk read error, a lost block). A load reads the copy's bytes
  as each ``HostLoadCopy`` moves a block, and checks them then (a DiskTier verifies each
  block as its I/O thread reads it, an LMCache-style chunk store each chunk): a copy
  step that reads while the copy is bad finds it out, and the load stops there
  (``HK_READ_BAD``: the load's own fact, not the copy's). Such a load is never reported
  as loaded (``HostLoadCommit`` refuses it, NoPartialUse) and it may fail; so may a
  load with a block left to read while the copy is bad (``HostLoadFail`` is then one
  step that reads that block and finds it bad: logs say "load failed" without the
  read). ``HostLoadFail`` gives back the partly loaded GPU blocks and the pin, turns the hit
  into a miss (unpublishes the copy: the next lookup misses) and leaves the request
  queued, to be computed again. A load that read every block before the bytes went bad
  read verified bytes: it commits. Whichever way a load that found bad bytes ends (its
  fail, or a cancel: ``host_quiesce``), the reader has learned the copy is bad, and the
  copy is unpublished.

Gated by ``Config.host_cache`` (0: off; 1: a cold cache; 2: warm, one published copy
at the start). Properties: PublishAfterCommit (a visible copy holds all its blocks),
NoReuseUnderIO (a pinned copy is never freed; a store's source is held), CapacityRefcount
(pins exact), NoPartialUse (a load is usable only whole and readable),
RecoverWithoutTimeout (a failed load does not loop).
"""

from __future__ import annotations

from spec.behaviours.async_steps import step_blocks_freeze
from spec.common import NOT_ENABLED, Mutants, Refused, Result, put, refuse, used_h, used_p
from spec.config import Config
from spec.state import (
    COMPLETE,
    FILLING,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUARANTINED,
    QUEUED,
    RUNNING,
    WRITABLE,
    Req,
    World,
)
from spec.window import window_whole

__all__ = [
    "HK_HIT",
    "HK_LOAD",
    "HK_LOADING",
    "HK_PINNED",
    "HK_READ_BAD",
    "HK_STORE",
    "EnvLoadFail",
    "HostEvict",
    "HostFree",
    "HostLateComplete",
    "HostLoadBegin",
    "HostLoadCommit",
    "HostLoadCopy",
    "HostLoadFail",
    "HostLookup",
    "HostPublish",
    "HostStoreAbort",
    "HostStoreBegin",
    "HostStoreCopy",
    "host_io_ok",
    "host_pins",
    "host_pins_exact",
    "host_published_whole",
    "host_quiesce",
    "host_quiet",
]

HK_HIT = 1  # a lookup hit: the copy is pinned, the load has not begun
HK_LOAD = 2  # a load from the copy is in flight (pinned; GPU blocks filling)
HK_STORE = 3  # this request's frozen GPU blocks are the source of the store in flight
HK_READ_BAD = 4  # a load that read unreadable bytes: it stopped there (pinned; it can only fail)
HK_PINNED = (HK_HIT, HK_LOAD, HK_READ_BAD)  # the roles that hold a pin on the copy
HK_LOADING = (HK_LOAD, HK_READ_BAD)  # a load in flight (GPU blocks filling)
_WAITING = (QUEUED, PREEMPTED)
_VISIBLE = (COMPLETE, QUARANTINED)  # bytes a pinned reader may still read


def _pin(w: World, k: int) -> World:
    return w._replace(hc_pin=w.hc_pin + k)


def HostLookup(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """A lookup of the request's prefix key hits the published copy and pins it."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.st not in _WAITING or r.p != NONE or r.hk:
        return NOT_ENABLED
    if r.ti:  # a session preempted between turns: its next turn comes first (TurnPrefill)
        return NOT_ENABLED
    if w.hc != COMPLETE:
        return refuse("PublishAfterCommit")  # a hit on a key that is not (or no more) visible
    return _pin(put(w, i, r._replace(hk=HK_HIT)), 1)


def HostLoadBegin(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Allocate GPU blocks for the hit and start the load (the request still waits)."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.hk != HK_HIT or r.st not in _WAITING or r.p != NONE:
        return NOT_ENABLED
    if used_p(w, c) + c.blocks > c.cap_p:
        return refuse("CapacityRefcount")
    w2 = put(w, i, r._replace(p=FILLING, gl=0, hk=HK_LOAD, pw=0))  # pw: a whole copy
    return _pin(w2, -1) if "unpin_at_load_start" in m else w2


def HostLoadCopy(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Read and check one block of the copy as it is now: a read of unreadable bytes is
    found out here, and the load stops (``HK_READ_BAD``)."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.hk != HK_LOAD or r.p != FILLING or r.gl >= c.blocks:
        return NOT_ENABLED
    return put(w, i, r._replace(gl=r.gl + 1, hk=HK_READ_BAD if w.hc_bad else HK_LOAD))


def HostLoadCommit(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Every block is back and read well: the GPU copy is the request's; the host copy
    stays (it is shared), only this request's pin is dropped."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.hk not in HK_LOADING or r.p != FILLING:
        return NOT_ENABLED
    if r.st not in _WAITING:
        return NOT_ENABLED
    if r.gl != c.blocks or r.hk == HK_READ_BAD:
        return refuse("NoPartialUse")  # a block missing, or one read from unreadable bytes
    w2 = put(w, i, r._replace(st=PREFILLING, p=WRITABLE, gl=0, hk=0))
    if "reload_consumes_shared" in m:  # the swap-in path: the host copy is freed
        w2 = w2._replace(hc=NONE, hc_hl=0)
    return _pin(w2, -1)


def HostLoadFail(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """A load that read unreadable bytes fails: the partly loaded blocks and the pin go
    back, the hit becomes a miss (the copy is unpublished), the request is computed again.
    Either its read already found the bytes bad (``HK_READ_BAD``), or this one step reads
    the next block and finds it bad (the copy is bad and a block is left to read: a log
    says "load failed" without the read that found it). A load that read every block
    before the damage cannot fail: it commits."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.hk not in HK_LOADING or r.p != FILLING:
        return NOT_ENABLED
    if r.hk == HK_LOAD and (not w.hc_bad or r.gl >= c.blocks):
        return NOT_ENABLED  # no read found bad bytes, and none is left that would
    if "failed_load_counted_loaded" in m:  # reported as loaded (dynamo #15079)
        return _pin(put(w, i, r._replace(st=PREFILLING, p=WRITABLE, gl=0, hk=0)), -1)
    w2 = _pin(put(w, i, r._replace(p=NONE, gl=0, hk=0)), -1)
    if w2.hc == COMPLETE and "failed_load_keeps_hit" not in m:  # vllm #49176 keeps it
        w2 = w2._replace(hc=QUARANTINED)
    return w2


def HostStoreBegin(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Freeze a running request's blocks and open the key's copy (filling, not visible)."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.st != RUNNING or r.p != WRITABLE or r.ps:
        return NOT_ENABLED
    if r.hk or r.h != NONE or w.hc != NONE or r.mv >= c.max_moves or not window_whole(r):
        return NOT_ENABLED
    if used_h(w, c) + c.blocks > c.cap_h:
        return refuse("CapacityRefcount")
    if (busy := step_blocks_freeze(c, r, m)) is not None:
        return busy
    w2 = put(w, i, r._replace(p=COMPLETE, hk=HK_STORE, mv=r.mv + 1))
    return w2._replace(hc=FILLING, hc_hl=0)


def HostStoreCopy(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.hk != HK_STORE or w.hc != FILLING or w.hc_hl >= c.blocks:
        return NOT_ENABLED
    return w._replace(hc_hl=w.hc_hl + 1)


def HostPublish(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The current attempt's store completed: the key becomes visible; the source thaws."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.hk != HK_STORE or w.hc != FILLING:
        return NOT_ENABLED
    if w.hc_hl != c.blocks and "publish_before_commit" not in m:
        return refuse("PublishAfterCommit")
    return put(w, i, r._replace(p=WRITABLE, hk=0))._replace(hc=COMPLETE)


def HostStoreAbort(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Give the store up (a timeout): the copy is dropped, the source thaws; the writer's
    completion of this (now older) attempt is still to come."""
    r = w.reqs[i]
    if not c.host_cache or not w.p_up or r.hk != HK_STORE or w.hc != FILLING:
        return NOT_ENABLED
    w2 = put(w, i, r._replace(p=WRITABLE, hk=0))
    return w2._replace(hc=NONE, hc_hl=0, hc_late=w.hc_late + 1)


def HostLateComplete(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The completion of an abandoned attempt arrives: a no-op on the key; its bytes go."""
    if not c.host_cache or not w.p_up or not w.hc_late:
        return NOT_ENABLED
    w2 = w._replace(hc_late=w.hc_late - 1)
    if "late_completion_publishes" in m:  # a stale PutEnd (Mooncake #3030)
        return w2._replace(hc=COMPLETE)
    return w2


def HostEvict(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Phase one of a delete: unpublish the copy (new lookups miss); readers drain."""
    if not c.host_cache or not w.p_up or w.hc != COMPLETE:
        return NOT_ENABLED
    return w._replace(hc=QUARANTINED)


def HostFree(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Phase two: free an unpublished copy once no pin is left on it."""
    if not c.host_cache or not w.p_up or w.hc not in _VISIBLE:
        return NOT_ENABLED
    if w.hc_pin and "evict_pinned_copy" not in m:
        return refuse("NoReuseUnderIO")  # a lookup hit or a load still reads it
    if w.hc == COMPLETE:
        return NOT_ENABLED  # published: unpublish it first (HostEvict)
    return w._replace(hc=NONE, hc_hl=0, hc_bad=False)


def EnvLoadFail(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The copy's bytes become unreadable (a read error, a lost page or file)."""
    if "load_fail" not in c.fault_kinds or w.faults >= c.faults or w.hc not in _VISIBLE:
        return NOT_ENABLED
    if w.hc_bad:
        return NOT_ENABLED
    return w._replace(hc_bad=True, faults=w.faults + 1)


# -- predicates and helpers the core modules call ----------------------------------------


def host_published_whole(w: World, c: Config) -> bool:
    """PublishAfterCommit: a visible copy holds every block of its (current) attempt."""
    return w.hc != COMPLETE or w.hc_hl == c.blocks


def host_io_ok(w: World, r: Req) -> bool:
    """NoReuseUnderIO: a pinned reader's copy is not freed; a store's source is held."""
    if r.hk in HK_PINNED and w.hc not in _VISIBLE:
        return False
    return r.hk != HK_STORE or (r.p == COMPLETE and w.hc == FILLING)


def host_pins(w: World) -> int:
    """The requests that hit the shared copy and have not loaded it (a pool helper: the
    z3 tracer reads it from its domain)."""
    return sum(1 for r in w.reqs if r.hk in HK_PINNED)


def host_pins_exact(w: World) -> bool:
    """CapacityRefcount: the copy's pins are the requests that hit it and have not loaded."""
    return w.hc_pin == host_pins(w)


def host_quiet(w: World) -> bool:
    """Quiescent: no pin, no store or late completion in flight, no copy half-deleted."""
    return not w.hc_pin and not w.hc_late and w.hc in (NONE, COMPLETE)


def host_quiesce(w: World, i: int) -> World | Refused:
    """An ended request lets go of the host cache: its load stops and its pin goes (the
    quiesce frees its GPU blocks); a load that found the copy's bytes bad unpublishes it,
    as its fail would; a store it is the source of must finish or be given up first."""
    r = w.reqs[i]
    if r.hk == HK_STORE:
        return refuse("NoReuseUnderIO")
    if not r.hk:
        return w
    w2 = _pin(put(w, i, r._replace(hk=0)), -1)
    return w2._replace(hc=QUARANTINED) if r.hk == HK_READ_BAD and w2.hc == COMPLETE else w2
