"""Sliding-window pruning: a running request frees the blocks that fell out of its window.

Engines: vLLM's ``SlidingWindowManager.remove_skipped_blocks`` (v1 core,
``single_type_kv_cache_manager``; the hybrid allocator calls it for each sliding-window
group from ``KVCacheManager.allocate_slots`` before a step) replaces the blocks wholly
before ``num_computed_tokens - sliding_window + 1`` by the null block and frees them back
to the pool while the request keeps running; SGLang's SWA memory pool
(``SWATokenToKVPoolAllocator``, ``free_swa``) and TensorRT-LLM's variable sliding-window
attention free out-of-window blocks the same way. The freed blocks go to other requests
at once. The bug class: a pruned block that a transfer still reads or writes (an offload
store or a host-cache store of the request, a handoff whose chunks read the source),
or a step still in flight that reads it (vLLM's async scheduling dispatches step N+1
before step N's output is processed).

The model: ``Req.pw`` counts the leading blocks of the prefill copy pruned out of the
window; they are freed (``spec.common.used_p`` counts ``blocks - pw``).
``PrefillPruneWindow`` prunes one more block of the request's **running, writable**
copy (``p`` writable, no handoff attempt open), keeping at least its newest block; a
prefill step in flight still reads the window it was dispatched with (NoReuseUnderIO,
as every free: ``step_blocks_free``). A frozen copy that a transfer reads (an offload
store, ``h`` filling; a host-cache store, ``hk`` store; a handoff that has still to
send, or a chunk of it in flight) is never pruned: that prune is refused
(NoReuseUnderIO), and the named mutant ``window_prunes_under_io`` takes it.

The model's transfers move whole copies (``c.blocks``): a copy that has pruned is not
frozen for a handoff, an offload or a host-cache store again (``window_whole``: not
enabled; an engine that moves only the window's blocks has no counterpart yet); it runs
to its end where it is, or is preempted. A copy given blocks anew (``PrefillAdmit``,
``HostLoadBegin``) starts whole (``pw = 0``).

Gated by ``Config.window``. Property: NoReuseUnderIO (``window_io_ok``: no pruned block
of a copy a transfer still reads).
"""

from __future__ import annotations

from spec.behaviours.async_steps import step_blocks_free
from spec.common import NOT_ENABLED, Mutants, Result, chunks_in_flight, put, refuse
from spec.config import Config
from spec.state import AWAIT_READY, COMPLETE, FILLING, IDLE, RUNNING, SENDING, WRITABLE, Req, World

__all__ = ["PrefillPruneWindow", "window_io_ok", "window_whole"]

_STORE = 3  # HK_STORE of spec/behaviours/host_cache.py (imported there from here: no cycle)


def window_read(r: Req) -> bool:
    """Does a transfer still read ``r``'s prefill copy (an offload or host-cache store, a
    handoff that still sends, or a chunk of its attempt in flight)?"""
    if r.p != COMPLETE:
        return False
    if r.h == FILLING or r.hk == _STORE or r.ps in (AWAIT_READY, SENDING):
        return True
    return chunks_in_flight(r, r.ep)


def PrefillPruneWindow(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Free the oldest block of a running request's copy that fell out of its window."""
    r = w.reqs[i]
    if not c.window or not w.p_up or r.st != RUNNING or r.pw + 1 >= c.blocks:
        return NOT_ENABLED
    if r.p == WRITABLE and r.ps == IDLE:
        if (busy := step_blocks_free(c, r, "p", m)) is not None:
            return busy  # a step in flight still reads the window it was dispatched with
        return put(w, i, r._replace(pw=r.pw + 1))
    if window_read(r):  # a store or a handoff still reads these blocks
        if "window_prunes_under_io" in m:
            return put(w, i, r._replace(pw=r.pw + 1))
        return refuse("NoReuseUnderIO")
    return NOT_ENABLED


def window_whole(r: Req) -> bool:
    """May ``r``'s prefill copy be frozen for a transfer (no block pruned from it)?"""
    return r.pw == 0


def window_io_ok(w: World, c: Config) -> bool:
    """NoReuseUnderIO: no block pruned from a copy that a store or a handoff still reads
    (a chunk in flight from a pruned source: ``spec.properties.no_reuse_under_io``)."""
    for r in w.reqs:
        if r.pw and r.p == COMPLETE:
            if r.h == FILLING or r.hk == _STORE or r.ps in (AWAIT_READY, SENDING):
                return False
    return True
