"""Helpers shared by the action modules: refusals, message surgery, pool usage.

An action returns the successor ``World`` or a ``Refused``. A refusal either says
"not enabled" (``prop is None``: the action does not apply to this state at all) or
names the property ID the action would break if it went ahead. The explorer treats
both as "no edge"; the trace checker and the refimpl report the property.
"""

from __future__ import annotations

from spec.config import Config
from spec.state import (
    CHUNKS,
    NONE,
    PREEMPTED,
    QUEUED,
    TO_DECODE,
    TO_PREFILL,
    Req,
    World,
    msg_epoch,
    msg_idx,
    msg_kind,
)


class Refused:
    """Why an action is not taken: ``prop`` is the property it would break, or None."""

    __slots__ = ("prop",)

    def __init__(self, prop: str | None) -> None:
        self.prop = prop

    def __repr__(self) -> str:
        return f"Refused({self.prop!r})"


NOT_ENABLED = Refused(None)
_REFUSALS: dict[str, Refused] = {}


def refuse(prop: str) -> Refused:
    """The (shared) refusal that names ``prop``."""
    r = _REFUSALS.get(prop)
    if r is None:
        r = _REFUSALS[prop] = Refused(prop)
    return r


Result = World | Refused
Mutants = frozenset[str]


def put(w: World, i: int, r: Req) -> World:
    """Replace request ``i`` (frame: everything else is unchanged)."""
    reqs = w.reqs
    return w._replace(reqs=reqs[:i] + (r,) + reqs[i + 1 :])


def send(w: World, net: tuple[int, ...], code: int) -> tuple[int, ...]:
    """Add ``code`` to a request's in-flight multiset; a message to a dead worker vanishes.
    A control message carries its sender's incarnation (a write carries its target's,
    set by its sender: spec/behaviours/restarts.py)."""
    kind = msg_kind(code)
    if (kind in TO_DECODE and not w.d_up) or (kind in TO_PREFILL and not w.p_up):
        return net
    if kind not in CHUNKS:
        code |= (w.d_inc if kind in TO_PREFILL else w.p_inc) << 24
    return tuple(sorted((*net, code)))


def add(net: tuple[int, ...], code: int) -> tuple[int, ...]:
    """Add one copy of ``code``, whoever is up (a fault's message: no sender rules)."""
    return tuple(sorted((*net, code)))


def take(net: tuple[int, ...], code: int) -> tuple[int, ...]:
    """Remove one copy of ``code``."""
    k = net.index(code)
    return net[:k] + net[k + 1 :]


def chunks_in_flight(r: Req, epoch: int, idx: int | None = None) -> bool:
    """Any one-sided write of ``epoch`` (of chunk ``idx``, when given) still in flight?"""
    for code in r.net:
        if msg_kind(code) in CHUNKS and msg_epoch(code) == epoch:
            if idx is None or msg_idx(code) == idx:
                return True
    return False


def drop_chunks(net: tuple[int, ...], epoch: int) -> tuple[int, ...]:
    """Fence: every write of ``epoch`` in flight fails."""
    return tuple(c for c in net if not (msg_kind(c) in CHUNKS and msg_epoch(c) == epoch))


def landed_at(r: Req, idx: int) -> bool:
    """Chunk ``idx`` has landed in ``r``'s decode replica (``Req.landed``, a bitmap)."""
    return bool(r.landed >> idx & 1)


def landed_chunks(r: Req) -> list[int]:
    """The indices of the chunks landed in ``r``'s decode replica, in order."""
    return [i for i in range(r.landed.bit_length()) if r.landed >> i & 1]


def sent_blocks(c: Config, hit: int) -> int:
    """Blocks per source rank that a handoff sends when decode holds ``hit`` prefix blocks."""
    return c.blocks - hit


def full_chunks(c: Config, hit: int) -> int:
    """Bitmask of every chunk an attempt must land (src_tp ranks x sent blocks)."""
    return (1 << (c.src_tp * sent_blocks(c, hit))) - 1


def full_ranks(c: Config) -> int:
    return (1 << c.src_tp) - 1


def used_p(w: World, c: Config) -> int:
    """Prefill blocks held: a source given back holds none (``fs``: spec/stream), a copy
    that pruned its window ``pw`` fewer (spec/window/__init__.py)."""
    return sum(c.blocks - r.pw for r in w.reqs if r.p != NONE and not r.fs)


def used_h(w: World, c: Config) -> int:
    """Host blocks held: per-request swap copies, and the shared cache's copy and the
    orphans of its late completions (spec/behaviours/host_cache.py)."""
    own = sum(c.blocks for r in w.reqs if r.h != NONE)
    return own + c.blocks * ((w.hc != NONE) + w.hc_late)


def used_d(w: World, c: Config) -> int:
    own = sum(c.blocks - r.hit for r in w.reqs if r.d != NONE)
    return own + (c.prefix if w.pfx else 0)


def prefix_refs(w: World) -> int:
    """References to the shared prefix: requests whose decode replica counts a hit (a
    pool helper: the z3 tracer reads it from its domain, as ``used_p``)."""
    return sum(1 for r in w.reqs if r.d != NONE and r.hit > 0)


def admit_possible(w: World, c: Config) -> bool:
    """Could some request be admitted now? (Only the sweep_only_on_admit mutant asks.)"""
    if not w.p_up or used_p(w, c) + c.blocks > c.cap_p:
        return False
    return any(r.st in (QUEUED, PREEMPTED) and r.p == NONE and r.h == NONE for r in w.reqs)


def timeouts_allowed(w: World, c: Config, m: Mutants) -> bool:
    return "sweep_only_on_admit" not in m or admit_possible(w, c)
