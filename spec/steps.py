"""Transition properties: predicates over one step (pre-state, action, post-state).

A state predicate cannot see a step that leaves no trace (a write is a self-loop) or
a step that only a history could judge (a stale message that changed something). Like
a TLA+ action property ``[][A => P]_vars``, each predicate here reads the pre-state,
the action (name, request slot ``i``, argument) and the post-state, and returns True
when the step is allowed. They read only state and the action's identity; no flag.

Each belongs to the safety property whose text it completes (``spec/properties.py``
attaches it as ``Property.step``); the explorer evaluates them on every edge.
"""

from __future__ import annotations

from collections.abc import Callable

from spec.behaviours.decode_failure import nothing_after_decode_failure
from spec.behaviours.host_cache import HK_READ_BAD
from spec.behaviours.identity import sent_staged
from spec.behaviours.restarts import older_incarnation
from spec.behaviours.slots import others_unchanged
from spec.common import full_chunks
from spec.config import Config
from spec.state import (
    CHUNKS,
    COMPLETE,
    DF_FAILED,
    ENDED,
    FILLING,
    M_DONE,
    M_HANDOFF,
    M_HANDOFF_BAD,
    RUNNING,
    TO_PREFILL,
    WRITABLE,
    Req,
    World,
    msg_epoch,
    msg_idx,
    msg_kind,
)

StepPred = Callable[[World, str, int, int, World, Config], bool]

# the actions that write a replica (append a token's KV), and the replica each writes
WRITES = {"PrefillDecodeStep": "p", "DecodeStep": "d"}
# the actions that consume a message sent to a worker (faults and the client excluded)
RECEIVES = frozenset(
    {
        "PrefillRecvReady",
        "PrefillRelease",
        "PrefillResume",
        "PrefillDiscard",
        "DecodeReserve",
        "DecodeReject",
        "DecodeReceiveChunk",
        "DecodeReceiveDone",
        "DecodeReclaim",
        "DecodeDiscard",
    }
)
_HELD = (COMPLETE, WRITABLE)


def changed(pre: World, post: World) -> list[tuple[Req, Req]]:
    """(before, after) of every request record the step replaced."""
    return [(a, b) for a, b in zip(pre.reqs, post.reqs, strict=True) if a is not b and a != b]


def _chunks(r: Req) -> int:
    return sum(1 for x in r.net if msg_kind(x) in CHUNKS)


def write_on_writable(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """FrozenSnapshot: a write acts on a writable replica of a running request, and the
    other replica is not writable. A frozen snapshot, a copy being stored and a
    validated but uncommitted replica are not writable."""
    rep = WRITES.get(name)
    if rep is None:
        return True
    r = pre.reqs[i]
    other = r.d if rep == "p" else r.p
    return r.st == RUNNING and getattr(r, rep) == WRITABLE and other != WRITABLE


def prefix_never_written(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """FrozenSnapshot: the shared prefix blocks are never written. A chunk lands in the
    attempt's own blocks (bits of ``full_chunks(hit)``); any other bit is a write into
    the ``hit`` prefix blocks decode shares with other requests."""
    for a, b in changed(pre, post):
        new = b.landed & ~a.landed
        if new & ~full_chunks(c, b.hit):
            return False
    return True


def stale_changes_nothing(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """Fencing: a message of another epoch than its receiver's, or of an older
    incarnation than its peer's current one (spec/behaviours/restarts.py), changes
    nothing but the network (it is consumed, or left in flight)."""
    if name not in RECEIVES:
        return True
    r = pre.reqs[i]
    kind, e = msg_kind(arg), msg_epoch(arg)
    if kind in TO_PREFILL:
        stale = e != r.ep
    elif kind in (M_HANDOFF, M_HANDOFF_BAD):
        stale = e <= r.dep  # an attempt decode has already seen (or a later one fenced)
    else:
        stale = e != r.dep
    if not stale and not (c.restarts and older_incarnation(pre, arg)):
        return True
    if post._replace(reqs=pre.reqs) != pre:
        return False
    for k, (a, b) in enumerate(zip(pre.reqs, post.reqs, strict=True)):
        if a is not b and a._replace(net=b.net) != b:
            return False
        if k != i and a is not b and a.net != b.net:
            return False
    return True


def nothing_after_end(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """StickyEnd: an ended status never changes; after the end no replica is validated,
    loaded or published (becomes complete or writable), decode never commits, and no
    chunk is sent. (A failed store thaws an ended request's source, complete to
    writable: no writer comes of it, since every write needs a running request.)"""
    for a, b in changed(pre, post):
        if a.st not in ENDED:
            continue
        if b.st != a.st:
            return False
        for before, after in ((a.p, b.p), (a.d, b.d), (a.h, b.h)):
            if after in _HELD and before not in _HELD:  # validated, loaded or published
                return False
        if b.d == WRITABLE and a.d != WRITABLE:  # committed
            return False
        if _chunks(b) > _chunks(a):
            return False
    return True


def whole_reload(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """NoPartialUse: a reload makes the GPU copy usable only once every block is back;
    a load from the shared host cache, only if none of its reads found unreadable bytes."""
    for a, b in changed(pre, post):
        if a.p == FILLING and b.p in _HELD and (a.gl != c.blocks or a.hk == HK_READ_BAD):
            return False
    return True


def ranks_from_messages(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """RankAgreement, from ground truth: decode's rank set gains rank k only in a step
    that consumes rank k's RankDone of decode's current epoch."""
    for k, (a, b) in enumerate(zip(pre.reqs, post.reqs, strict=True)):
        if a is b:
            continue
        new = b.rmask & ~a.rmask
        if not new:
            continue
        consumed = (
            k == i
            and name in RECEIVES
            and msg_kind(arg) == M_DONE
            and msg_epoch(arg) == b.dep
            and b.dep == a.dep
            and len(b.net) < len(a.net)
        )
        if not consumed or new != 1 << msg_idx(arg):
            return False
    return True


def dst_ranks_from_installs(
    pre: World, name: str, i: int, arg: int, post: World, c: Config
) -> bool:
    """RankAgreement on the receiving side: a decode rank counts as installed only from
    its own install step (one rank, of a validated replica of the same attempt)."""
    for k, (a, b) in enumerate(zip(pre.reqs, post.reqs, strict=True)):
        if a is b:
            continue
        new = b.dmask & ~a.dmask
        if not new:
            continue
        own = name == "DecodeRankInstall" and k == i and a.d == COMPLETE and a.dep == b.dep
        if not own or new & (new - 1):
            return False
    return True


def own_request_only(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """Fencing, across requests: a message of request ``i`` changes no other request
    (its room names its request; a slot id reused by another request does not)."""
    return name not in RECEIVES or others_unchanged(pre, i, post)


def check_step(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> list[str]:
    """IDs of the properties whose transition predicate this step breaks."""
    if step_plain(pre, name, i, arg, post, c):
        return []
    out = [pid for pid, pred in STEP_PREDS if not pred(pre, name, i, arg, post, c)]
    return list(dict.fromkeys(out))


def step_plain(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """A cheap sufficient test that no transition predicate can fail on this step (the
    explorer's fast path; ``tests/spec/test_steps.py`` checks it against the predicates):
    not a write, not a receive, not a send of a world that stages (``Config.identity``),
    and no changed request has ended, gained landed chunks or ranks, or left a reload."""
    if name in WRITES or name in RECEIVES or (c.identity and name == "PrefillSendChunk"):
        return False
    for a, b in zip(pre.reqs, post.reqs, strict=True):
        if a is b:
            continue
        if a.st in ENDED or a.p == FILLING or b.landed & ~a.landed or b.rmask & ~a.rmask:
            return False
        if a.dfl & DF_FAILED:  # an attempt decode failed (nothing_after_decode_failure)
            return False
        if b.dmask & ~a.dmask:
            return False
    return True


# property ID -> its transition predicates (a property may have several)
STEP_PREDS: tuple[tuple[str, StepPred], ...] = (
    ("NoPartialUse", whole_reload),
    ("FrozenSnapshot", write_on_writable),
    ("FrozenSnapshot", prefix_never_written),
    ("Fencing", stale_changes_nothing),
    ("StickyEnd", nothing_after_end),
    ("RankAgreement", ranks_from_messages),
    ("StickyEnd", nothing_after_decode_failure),
    ("RankAgreement", dst_ranks_from_installs),
    ("ContentIdentity", sent_staged),
    ("Fencing", own_request_only),
)
