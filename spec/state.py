"""Frozen state records of the KV-ownership model, and their type-ok check.

A state is a ``World``: a tuple of per-request ``Req`` records plus a few global
fields. Everything is a small int (or a tuple of them) so that states hash fast and
the explorer can intern them. Requests are interchangeable: ``canonical()`` sorts
them, which is the symmetry reduction.

Locations of a request's KV (one replica each):

- ``p``: the prefill worker's GPU pool (TP ranks ``1..src_tp``);
- ``d``: the decode worker's GPU pool (TP ranks ``1..dst_tp``);
- ``h``: host memory (pinned CPU) on the prefill node: the offload tier.

Messages in flight belong to their request (``Req.net``, a sorted tuple: a multiset,
so delivery order is free and reordering is unbounded).
"""

from __future__ import annotations

from typing import Any, NamedTuple

# -- request status (the router's view of the request; one logical register) --------
QUEUED = 0  # not admitted, holds nothing
PREFILLING = 1  # admitted: blocks allocated on P, KV being computed
RUNNING = 2  # KV complete somewhere (P, D or host)
PREEMPTED = 3  # KV dropped on purpose; must be prefilled again (recompute)
FINISHED = 4  # terminal: done
CANCELLED = 5  # terminal, sticky: the client cancelled
FAILED = 6  # terminal, sticky: a timeout, a crash or a refused handoff
STATUS_NAMES = ("queued", "prefilling", "running", "preempted", "finished", "cancelled", "failed")
ENDED = (FINISHED, CANCELLED, FAILED)  # a tuple: ``in`` compares, so it traces (z3)
STICKY = frozenset({CANCELLED, FAILED})

# -- replica status, one per location ------------------------------------------------
NONE = 0  # no blocks here
RESERVED = 1  # blocks set aside, nothing landed yet
FILLING = 2  # some blocks landed (see landed / hl / gl)
COMPLETE = 3  # validated (or frozen), read-only
WRITABLE = 4  # held by the one owner, which may append
QUARANTINED = 5  # released by the request, but a writer may still land bytes
REPLICA_NAMES = ("none", "reserved", "filling", "complete", "writable", "quarantined")

# -- prefill-side sender phase of the current handoff attempt ------------------------
IDLE = 0  # no handoff attempt
AWAIT_READY = 1  # frozen, manifest sent, waiting for decode's reservation
SENDING = 2  # sending chunks, then one RankDone per source rank
AWAIT_ACK = 3  # everything sent; waiting for decode's word (ACK or NACK)
SENDER_NAMES = ("idle", "await_ready", "sending", "await_ack")

# -- decode replica flags (dfl) ------------------------------------------------------
DF_MISMATCH = 1  # the attempt's manifest is incompatible with the decode side
DF_CORRUPT = 2  # a chunk landed whose checksum does not match the manifest
DF_FENCED = 4  # decode fenced the attempt (closed the connection): its writes fail
DF_FAILED = 8  # decode failed the attempt on its own error: terminal for that attempt
DF_UNSTAGED = 16  # a chunk landed whose content the sender never staged (spec/behaviours/identity)

# -- ghost (history) flags, used only by the property predicates ---------------------
G_FROZEN_WRITE = 1  # the source was written while its snapshot was being transferred
G_STALE = 2  # a message of another epoch changed state
G_FOREIGN = 4  # a chunk landed in blocks not held for its attempt
G_POSTEND = 8  # validate/commit/finish happened after the request was cancelled/failed
G_END_CANCELLED = 16  # the request was cancelled at some point
G_END_FAILED = 32  # the request failed at some point

# -- messages: code = inc << 24 | epoch << 8 | kind << 4 | idx ------------------------
# ``inc``: the incarnation the message belongs to (spec/behaviours/restarts.py): a control
# message carries its sender's, a one-sided write the one whose registration it targets.
# It is 0 in every world without restarts, so those codes are the older ``epoch << 8 | ..``.
M_HANDOFF = 1  # P->D: freeze done, here is the manifest (idx unused)
M_HANDOFF_BAD = 2  # P->D: the same, with a manifest the decode side cannot accept
M_READY = 3  # D->P: blocks reserved; idx = prefix blocks decode already holds
M_CHUNK = 4  # P->D: one-sided write of chunk idx (rank-major: rank * m + block)
M_CHUNK_BAD = 5  # P->D: the same chunk, corrupted on the way
M_DONE = 6  # P->D: source rank idx has sent all its chunks
M_ACK = 7  # D->P: committed (the commit point has passed)
M_NACK = 8  # D->P: this epoch will never commit; the source may resume
M_QUIESCED = 9  # P->D: no write of this epoch is in flight any more
M_CHUNK_UNSTAGED = 13  # P->D: chunk idx of a block the sender never staged (bytes not its hash's)
MSG_NAMES = {
    M_HANDOFF: "Handoff",
    M_HANDOFF_BAD: "HandoffBadManifest",
    M_READY: "Ready",
    M_CHUNK: "Chunk",
    M_CHUNK_BAD: "ChunkCorrupt",
    M_DONE: "RankDone",
    M_ACK: "Ack",
    M_NACK: "Nack",
    M_QUIESCED: "Quiesced",
    M_CHUNK_UNSTAGED: "ChunkUnstaged",
}
TO_DECODE = frozenset(
    {M_HANDOFF, M_HANDOFF_BAD, M_CHUNK, M_CHUNK_BAD, M_DONE, M_QUIESCED, M_CHUNK_UNSTAGED}
)
TO_PREFILL = frozenset({M_READY, M_ACK, M_NACK})
CHUNKS = frozenset({M_CHUNK, M_CHUNK_BAD, M_CHUNK_UNSTAGED})


def msg(kind: int, epoch: int, idx: int = 0, inc: int = 0) -> int:
    """Encode a message as one small int."""
    return (inc << 24) | (epoch << 8) | (kind << 4) | idx


def msg_kind(code: int) -> int:
    return (code >> 4) & 0xF


def msg_epoch(code: int) -> int:
    return (code >> 8) & 0xFFFF


def msg_idx(code: int) -> int:
    return code & 0xF


def msg_inc(code: int) -> int:
    """The incarnation a message belongs to (0 unless a worker has restarted)."""
    return code >> 24


def msg_str(code: int) -> str:
    inc = f",inc={msg_inc(code)}" if msg_inc(code) else ""
    return f"{MSG_NAMES[msg_kind(code)]}(e={msg_epoch(code)},i={msg_idx(code)}{inc})"


class Req(NamedTuple):
    """One request: its status, its three replicas, its handoff attempt, its messages."""

    st: int = QUEUED  # request status (QUEUED..FAILED)
    p: int = NONE  # replica on the prefill GPU
    d: int = NONE  # replica on the decode GPU
    h: int = NONE  # replica in host memory (offload tier)
    ep: int = 0  # prefill's current handoff epoch (0: never frozen)
    dep: int = 0  # decode's epoch: the newest attempt it has seen (a fence)
    ps: int = IDLE  # prefill's sender phase
    sent: int = 0  # items sent in SENDING (chunks and RankDones, rank-major)
    phit: int = 0  # prefix blocks decode said it holds (prefill's copy, from Ready)
    hit: int = 0  # prefix blocks decode holds for this attempt (decode's copy)
    landed: int = 0  # bitmask of chunks landed in decode's reserved blocks
    rmask: int = 0  # bitmask of source ranks whose RankDone decode received
    rcnt: int = 0  # RankDone messages counted (used only by a mutant)
    dfl: int = 0  # decode replica flags (DF_*)
    hl: int = 0  # blocks stored to host by the in-flight offload
    gl: int = 0  # blocks loaded to GPU by the in-flight reload
    mv: int = 0  # offloads + preemptions so far (bounded by the config)
    g: int = 0  # ghost history flags (G_*)
    net: tuple[int, ...] = ()  # messages in flight, sorted (a multiset)
    pstep: int = 0  # a step dispatched on prefill, not yet completed (async_steps)
    dstep: int = 0  # a step dispatched on decode, not yet completed (async_steps)
    dmask: int = 0  # decode ranks that installed their shard (Config.decode_ranks)
    rinc: int = 0  # decode incarnation of the Ready prefill last took: its writes' target
    stg: int = 0  # blocks the sender has staged for its current attempt (identity worlds)
    sl: int = 0  # 1: decode holds the metadata slot for this request (slots worlds)
    hk: int = 0  # its role at the shared host cache: HK_* of spec/behaviours/host_cache.py
    tn: int = 0  # next turn: 1 routed to decode (session pinned), 2 appending (turns worlds)
    ti: int = 0  # 1: the turn ended; the session's KV waits on decode for the next one
    tdv: int = 0  # 1: decode's session KV has a tail the next prompt does not share
    tc: int = 0  # turns started after the first (bounded: spec/behaviours/turns.py)
    lay: int = 0  # layers the sender was given (send_layer) for its attempt (spec/stream)
    cpy: int = 0  # of them, layers the sender copied at send_layer (their snapshot point)
    fs: int = 0  # 1: the request gave its source blocks back (a streamed offer's copies stay)
    inl: int = 0  # layers decode installed in the blocks the engine reads (out of staging)
    rdy: int = 0  # layers decode reported ready to its engine (Receiver.layer_ready)
    pw: int = 0  # leading blocks of the prefill copy pruned out of the window (spec/window)


class World(NamedTuple):
    """A global state."""

    reqs: tuple[Req, ...]
    faults: int = 0  # faults injected so far (bounded by the config)
    p_up: bool = True  # prefill worker alive
    d_up: bool = True  # decode worker alive
    pfx: bool = False  # the shared prefix blocks are resident on decode
    pfx_ref: int = 0  # references to the shared prefix (requests holding it)
    p_inc: int = 0  # prefill worker's incarnation (restarts so far; spec/behaviours/restarts)
    d_inc: int = 0  # decode worker's incarnation
    pfx_ok: bool = True  # the cached prefix blocks hold the prefix's content (hash matches)
    hc: int = NONE  # the shared host cache's copy of the prompt's key (behaviours/host_cache)
    hc_hl: int = 0  # blocks the current store attempt has written into that copy
    hc_pin: int = 0  # pins on the copy (lookup hits whose load has not completed)
    hc_late: int = 0  # completions of abandoned (older) store attempts still in flight
    hc_bad: bool = False  # the copy's bytes are unreadable: a load that reads them fails


_KEEP = object()  # "field not given" in the fast ``_replace`` below


def _fast_replace(cls: type[Any]) -> None:
    """Give a NamedTuple a faster ``_replace`` with the same meaning.

    The standard one goes through ``**kwargs``, ``map`` and ``_make``; every successor
    of every explored state is built by it, so it dominated the explorer's profile.
    This one is generated from ``cls._fields`` (as ``collections.namedtuple`` generates
    its own code), takes each field as a keyword-only argument and builds the tuple in
    one call: about three times faster. An unknown field is still a TypeError.
    """
    fields = cls._fields
    args = ", ".join(f"{f}=_KEEP" for f in fields)
    vals = ", ".join(f"self[{k}] if {f} is _KEEP else {f}" for k, f in enumerate(fields))
    ns: dict[str, Any] = {"_KEEP": _KEEP, "_new": tuple.__new__, "_cls": cls}
    exec(f"def _replace(self, /, *, {args}):\n    return _new(_cls, ({vals},))\n", ns)
    fn = ns["_replace"]
    fn.__doc__ = f"Return a new {cls.__name__} with the given fields replaced."
    cls._replace = fn


_fast_replace(Req)
_fast_replace(World)


def canonical(w: World) -> World:
    """Symmetry reduction: requests are interchangeable, so sort them."""
    reqs = w.reqs
    if len(reqs) < 2:
        return w
    s = tuple(sorted(reqs))
    return w if s == reqs else w._replace(reqs=s)


def canonical_perm(w: World) -> tuple[World, tuple[int, ...]]:
    """Canonical form plus ``perm``: canonical slot i holds concrete request perm[i]."""
    order = tuple(sorted(range(len(w.reqs)), key=lambda i: w.reqs[i]))
    return w._replace(reqs=tuple(w.reqs[i] for i in order)), order


def type_ok(w: World, n_blocks: int, src_tp: int, max_epoch: int) -> list[str]:
    """Every field in range; returns the list of problems (empty when type-ok)."""
    bad: list[str] = []
    for i, r in enumerate(w.reqs):
        checks = (
            ("st", 0 <= r.st <= FAILED),
            ("p", 0 <= r.p <= QUARANTINED),
            ("d", 0 <= r.d <= QUARANTINED),
            ("h", 0 <= r.h <= QUARANTINED),
            ("ep", 0 <= r.ep <= max_epoch),
            ("dep", 0 <= r.dep <= max_epoch),
            ("ps", 0 <= r.ps <= AWAIT_ACK),
            ("hit", 0 <= r.hit <= n_blocks and 0 <= r.phit <= n_blocks),
            ("landed", 0 <= r.landed < (1 << (src_tp * n_blocks))),
            ("rmask", 0 <= r.rmask < (1 << src_tp)),
            ("hl/gl", 0 <= r.hl <= n_blocks and 0 <= r.gl <= n_blocks),
            ("net", list(r.net) == sorted(r.net)),
            ("pstep/dstep", r.pstep in (0, 1) and r.dstep in (0, 1)),
            ("dmask", 0 <= r.dmask < (1 << 4)),
            ("rinc", 0 <= r.rinc <= w.d_inc),
            ("stg", 0 <= r.stg <= n_blocks),
            ("sl", r.sl in (0, 1)),
            ("hk", 0 <= r.hk <= 4),
            ("tn/ti/tdv", 0 <= r.tn <= 2 and r.ti in (0, 1) and r.tdv in (0, 1)),
            ("tc", 0 <= r.tc <= 15),
            ("lay/cpy/inl/rdy", all(0 <= x <= 15 for x in (r.lay, r.cpy, r.inl, r.rdy))),
            ("fs", r.fs in (0, 1) and r.cpy <= r.lay),
            ("pw", 0 <= r.pw < max(n_blocks, 1)),
        )
        bad.extend(f"req {i}: {name}" for name, ok in checks if not ok)
    if w.pfx_ref < 0:
        bad.append("pfx_ref < 0")
    if w.p_inc < 0 or w.d_inc < 0:
        bad.append("p_inc/d_inc < 0")
    if sum(r.sl for r in w.reqs) > 1:
        bad.append("sl: more than one holder of the metadata slot")
    if w.hc not in (NONE, FILLING, COMPLETE, QUARANTINED) or not 0 <= w.hc_hl <= n_blocks:
        bad.append("hc/hc_hl")
    if not 0 <= w.hc_pin <= len(w.reqs) or not 0 <= w.hc_late <= 3:
        bad.append("hc_pin/hc_late")
    return bad
