"""One predicate per property, in a registry. IDs are used verbatim everywhere.

Safety predicates take a state and return True when the property holds there.
Liveness properties are goals over the state graph; their predicates here define the
goal states and the edge kinds, and ``model_checks/explicit/liveness.py`` checks them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spec.behaviours.async_steps import steps_drained, steps_held, steps_write_writable
from spec.behaviours.decode_ranks import all_dst_ranks
from spec.behaviours.host_cache import (
    HK_LOADING,
    host_io_ok,
    host_pins_exact,
    host_published_whole,
    host_quiet,
)
from spec.behaviours.identity import content_identity
from spec.behaviours.turns import turns_identity, turns_kept, turns_single_writer
from spec.common import full_chunks, full_ranks, prefix_refs, used_d, used_h, used_p
from spec.config import Config
from spec.state import (
    CANCELLED,
    CHUNKS,
    COMPLETE,
    DF_CORRUPT,
    DF_FAILED,
    DF_FENCED,
    DF_MISMATCH,
    ENDED,
    FAILED,
    FILLING,
    G_END_CANCELLED,
    G_END_FAILED,
    G_FOREIGN,
    G_FROZEN_WRITE,
    G_POSTEND,
    G_STALE,
    IDLE,
    NONE,
    PREFILLING,
    QUARANTINED,
    RESERVED,
    RUNNING,
    WRITABLE,
    World,
    msg_epoch,
    msg_inc,
    msg_kind,
)
from spec.stream.layers import stream_bytes_held, stream_ready_installed, stream_sent_given
from spec.window import window_io_ok

Pred = Callable[[World, Config], bool]
_HELD = (COMPLETE, WRITABLE)
_HAS_KV = (PREFILLING, RUNNING)  # the live statuses whose KV exists (not queued, preempted)


def single_writer(w: World, c: Config) -> bool:
    if not turns_single_writer(w, c):  # an append while the session's turn decodes
        return False
    return all(not (r.p == WRITABLE and r.d == WRITABLE) for r in w.reqs)


def no_partial_use(w: World, c: Config) -> bool:
    if not stream_ready_installed(w, c):  # a layer reported ready only in staging
        return False
    for r in w.reqs:
        if r.d in _HELD and (r.landed != full_chunks(c, r.hit) or r.dfl & DF_CORRUPT):
            return False
    return True


def nothing_lost(w: World, c: Config) -> bool:
    """Every live request that has KV (prefilling or running) holds a complete or
    writable copy somewhere, on a worker that is up (a crashed worker's GPU and host
    memory are gone: a copy there is no copy); a queued or preempted one holds none by
    design (it is prefilled, again, from its tokens)."""
    for r in w.reqs:
        on_p = w.p_up and (r.p in _HELD or r.h == COMPLETE)
        if r.st in _HAS_KV and not on_p and not (w.d_up and r.d in _HELD):
            return False
    return turns_kept(w, c)  # a turn routed to decode: the session's KV is there


def frozen_snapshot(w: World, c: Config) -> bool:
    if not stream_sent_given(w, c):  # a streamed chunk sent before its layers were given
        return False
    return all(not r.g & G_FROZEN_WRITE for r in w.reqs) and steps_write_writable(w, c)


def fencing(w: World, c: Config) -> bool:
    return all(not r.g & G_STALE for r in w.reqs)


def no_reuse_under_io(w: World, c: Config) -> bool:
    if not steps_held(w, c):  # a step in flight writes blocks its worker freed
        return False
    if not stream_bytes_held(w, c):  # a freed source with a layer not yet copied
        return False
    if not window_io_ok(w, c):  # a store or a handoff reads blocks pruned from its source
        return False
    for r in w.reqs:
        if r.g & G_FOREIGN:
            return False
        if r.h == FILLING and r.p != COMPLETE:  # a store reads freed or live blocks
            return False
        if r.p == FILLING and r.h not in (COMPLETE, FILLING) and r.hk not in HK_LOADING:
            return False  # a load reads a freed copy
        if r.hk and not host_io_ok(w, r):  # the shared host cache (behaviours/host_cache)
            return False
        for code in r.net:
            if msg_kind(code) not in CHUNKS:
                continue
            e = msg_epoch(code)
            if r.ps == IDLE or r.ep != e or r.p != COMPLETE or r.pw:  # the source blocks
                return False
            held = r.dep == e and r.d in (RESERVED, FILLING, QUARANTINED)
            fenced = c.revocable and r.dep == e and r.dfl & DF_FENCED  # no revoke: no fence
            if not held and not fenced:  # the destination blocks
                if msg_inc(code) >= w.d_inc:  # (an older incarnation's registration is gone)
                    return False
    return True


def sticky_end(w: World, c: Config) -> bool:
    for r in w.reqs:
        if r.g & G_POSTEND:
            return False
        if r.g & G_END_CANCELLED and r.st != CANCELLED:
            return False
        if r.g & G_END_FAILED and r.st != FAILED:
            return False
        if r.d in _HELD and r.dfl & DF_FAILED:  # an attempt decode failed was installed
            return False
    return True


def content_identity_all(w: World, c: Config) -> bool:
    """ContentIdentity: the handoff's blocks (behaviours/identity) and a session's KV
    between turns (behaviours/turns: no divergent tail appended to or decoded on)."""
    return content_identity(w, c) and turns_identity(w, c)


def manifest_gate(w: World, c: Config) -> bool:
    return all(not (r.d in _HELD and r.dfl & DF_MISMATCH) for r in w.reqs)


def pools_recounted(w: World, c: Config) -> bool:
    """The pool counts that admission, reservation and the stores read (spec.common's
    ``used_p``, ``used_h``, ``used_d``: the allocators' counters) are the blocks the
    replicas hold, recounted replica by replica: a prefill copy holds its blocks unless
    its stream gave them back (``fs``), less the window it pruned (``pw``); a host copy
    its blocks, as do the shared host cache's copy and each late completion's orphan; a
    decode replica its blocks less its prefix hit, and the cached prefix its own. As the
    prefix refcount is exact below, a counter that misses a holder (and so admits past
    capacity) breaks it. The z3 domains define the pools themselves by the same count
    (``finite.FCtx.used_p``, the unbounded model's counters; the tracer reads this
    check as true there, tests/symbolic/test_props_derived compares)."""
    p = sum(c.blocks - r.pw for r in w.reqs if r.p != NONE and not r.fs)
    h = c.blocks * (sum(1 for r in w.reqs if r.h != NONE) + (w.hc != NONE) + w.hc_late)
    d = sum(c.blocks - r.hit for r in w.reqs if r.d != NONE) + (c.prefix if w.pfx else 0)
    return (used_p(w, c), used_h(w, c), used_d(w, c)) == (p, h, d)


def capacity_refcount(w: World, c: Config) -> bool:
    if used_p(w, c) > c.cap_p or used_d(w, c) > c.cap_d or used_h(w, c) > c.cap_h:
        return False
    if not pools_recounted(w, c):
        return False
    if not host_pins_exact(w):
        return False
    refs = prefix_refs(w)
    return w.pfx_ref == refs and w.pfx_ref >= 0 and (w.pfx_ref == 0 or w.pfx)


def rank_agreement(w: World, c: Config) -> bool:
    """Every source rank reported for a validated replica; with decode ranks, a committed
    replica has every decode rank installed, and no rank is installed without one."""
    dst = all_dst_ranks(c)
    for r in w.reqs:
        if r.d in _HELD and r.rmask != full_ranks(c):
            return False
        if (r.d == WRITABLE and r.dmask != dst) or (r.dmask and r.d not in _HELD):
            return False
        if r.dmask & ~dst:
            return False
    return True


def publish_after_commit(w: World, c: Config) -> bool:
    if not host_published_whole(w, c):
        return False
    return all(not (r.h == COMPLETE and r.hl != c.blocks) for r in w.reqs)


def load_xor_store(w: World, c: Config) -> bool:
    return all(not (r.p == FILLING and r.h == FILLING) for r in w.reqs)


def quiescent_terminal(w: World, c: Config) -> bool:
    """Liveness goal: every request ended, no block held, nothing in flight."""
    for r in w.reqs:
        if r.st not in ENDED or r.p or r.d or r.h or r.ps != IDLE or r.net:
            return False
        if c.async_steps and not steps_drained(r):
            return False
    return w.pfx_ref == 0 and host_quiet(w)


def decode_waiting(w: World, c: Config) -> bool:
    """Decode holds blocks for an attempt it is still waiting on."""
    return any(r.d in (RESERVED, FILLING, QUARANTINED) for r in w.reqs)


def prefill_waiting(w: World, c: Config) -> bool:
    """Prefill holds a frozen source for an attempt it is still waiting on."""
    return any(r.ps != IDLE for r in w.reqs)


@dataclass(frozen=True)
class Property:
    id: str
    kind: str  # "safety" or "liveness"
    doc: str
    pred: Pred | None = None  # safety only


SAFETY: tuple[Property, ...] = (
    Property("SingleWriter", "safety", "At most one writable replica per request.", single_writer),
    Property(
        "NoPartialUse",
        "safety",
        "A replica is complete/installed only if every advertised chunk landed with its checksum.",
        no_partial_use,
    ),
    Property(
        "NothingLost",
        "safety",
        "Every live request with KV (prefilling or running) has a complete copy somewhere;"
        " one without is queued or preempted (marked for recompute).",
        nothing_lost,
    ),
    Property(
        "FrozenSnapshot",
        "safety",
        "The source is not written while its snapshot is being transferred or stored.",
        frozen_snapshot,
    ),
    Property("Fencing", "safety", "A message of another epoch changes nothing.", fencing),
    Property(
        "NoReuseUnderIO",
        "safety",
        "No block is free or reused while it is the source or destination of live I/O.",
        no_reuse_under_io,
    ),
    Property(
        "StickyEnd",
        "safety",
        "Cancelled and failed are sticky: no validate, commit or success after them.",
        sticky_end,
    ),
    Property(
        "ManifestGate",
        "safety",
        "Install only on a compatible manifest.",
        manifest_gate,
    ),
    Property(
        "CapacityRefcount",
        "safety",
        "Capacity never exceeded; prefix refcount exact, never negative; freed only at zero.",
        capacity_refcount,
    ),
    Property(
        "RankAgreement",
        "safety",
        "A transfer completes only when every source rank reported; duplicates don't count."
        " Decode runs it only when every decode rank installed its shard.",
        rank_agreement,
    ),
    Property(
        "PublishAfterCommit",
        "safety",
        "A host copy is visible (reloadable) only after its store completed; a shared"
        " host-cache key only while published, with every block of its current attempt.",
        publish_after_commit,
    ),
    Property(
        "LoadXorStore",
        "safety",
        "Per request, a load or stores are in flight, never both.",
        load_xor_store,
    ),
    Property(
        "ContentIdentity",
        "safety",
        "A block used (validated, committed, decoded) holds the content its advertised hash"
        " names: no foreign prefix block, no block its sender never staged.",
        content_identity_all,
    ),
)

LIVENESS: tuple[Property, ...] = (
    Property(
        "NoDeadlock",
        "liveness",
        "From every reachable state a quiescent terminal state is reachable, also without"
        " the client (a cancel is never the only way out).",
    ),
    Property(
        "FairTermination",
        "liveness",
        "With no faults, no cancel and no timeout, every run can end quiescent; cancel"
        " needs no timeout; every cycle leaves under weak fairness of protocol actions.",
    ),
    Property(
        "BoundedExit",
        "liveness",
        "Every waiting worker can free what it holds by its own steps and timeouts alone.",
    ),
    Property(
        "RecoverWithoutTimeout",
        "liveness",
        "With protocol actions and faults that lose nothing (duplicate, corrupt, mismatch,"
        " store failure), and no timeout or cancel, every run can still end quiescent.",
    ),
    Property(
        "ReleaseWhileRunning",
        "liveness",
        "Once decode has committed a running request, the source can be freed while the"
        " request still runs.",
    ),
)

PROPERTIES: dict[str, Property] = {p.id: p for p in (*SAFETY, *LIVENESS)}


def violated_safety(w: World, c: Config) -> list[str]:
    """IDs of the safety properties ``w`` breaks."""
    return [p.id for p in SAFETY if p.pred is not None and not p.pred(w, c)]
