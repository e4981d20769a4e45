"""The inductive invariant of the spec, conjunct by conjunct (see spec/INVARIANTS.md).

Each ``Conj`` has a scope: ``glob`` (globals and ghost counters), ``req`` (one request:
it must hold for every request) or ``slot`` (one request and one message slot
``(epoch, idx)``: it may read the count of every message kind at that slot, and
``landed[idx]``; it must hold for every slot of every request). The 12 safety
properties are conjuncts themselves (same IDs; a message part is named ``ID.msg``);
``STRENGTHENING`` holds the others. ``SUPPORT`` names, per property, the conjuncts its
proof uses (closed: each is inductive relative to the list).

Every conjunct is traced from the spec's own predicate (``spec/properties.py``,
``spec/invariants``; ``tracer.predicate``): none is written again here, except what a
Python predicate cannot say (``Z3_ONLY``). ``tests/symbolic/test_conjuncts_derived.py``
checks the traced scopes against the spec on explored states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from model_checks.symbolic.core import RV, A, Ctx, O, Z
from model_checks.symbolic.props import SUPPORT as SUPPORT  # re-exported: the table lives there
from model_checks.symbolic.props import ZPROPS, ZProp
from model_checks.symbolic.tracer.predicate import conj_glob, conj_req, conj_slot
from spec.invariants import INVARIANTS, Conjunct
from spec.state import M_CHUNK_UNSTAGED

ReqFn = Callable[[Ctx, RV], Z]
SlotFn = Callable[[Ctx, RV, Z, Z], Z]  # (ctx, request, epoch, idx)
GlobFn = Callable[[Ctx], Z]

KINDS = (*range(1, 10), M_CHUNK_UNSTAGED)


@dataclass(frozen=True)
class Conj:
    name: str
    scope: str  # "glob", "req" or "slot"
    doc: str
    req: ReqFn | None = None
    slot: SlotFn | None = None
    glob: GlobFn | None = None


def _n(r: RV, kind: int, e: Z, i: Z) -> Z:
    return r.net.count(kind, e, i)


def _msg_slot(zp: ZProp) -> SlotFn:
    """``zp``'s scope of one message in flight, for every kind at the slot's epoch and
    index (the kinds whose message changes nothing drop out: ``ZProp.msg_part``)."""

    def slot(x: Ctx, r: RV, e: Z, i: Z) -> Z:
        req, reads = zp.req_reads(x, r)
        if not reads:  # the predicate never looks at the request's messages
            return z3.BoolVal(True)
        parts = ((k, zp.msg_part(x, r, k, e, i, req)) for k in sorted(zp.msg_kinds))
        out = A(*(O(_n(r, k, e, i) <= 0, t) for k, t in parts if t is not None))
        return z3.BoolVal(out) if isinstance(out, bool) else out

    return slot


def _whole_req(zp: ZProp) -> ReqFn:
    """``zp``'s global and per-request scopes, as one conjunct per request."""
    return lambda x, r: A(zp.glob(x), zp.req(x, r))


def from_props() -> dict[str, list[Conj]]:
    """The property conjuncts, by property ID: each property's global and per-request
    scopes, and its per-message one (``ZProp``: all three traced from the spec)."""
    out: dict[str, list[Conj]] = {}
    for pid, zp in ZPROPS.items():
        out[pid] = [
            Conj(pid, "req", zp.id, req=_whole_req(zp)),
            Conj(f"{pid}.msg", "slot", "messages in flight", slot=_msg_slot(zp)),
        ]
    return out


PROPERTY_CONJUNCTS = from_props()


# -- the strengthening: INVARIANTS.md's conjuncts, traced from spec/invariants -------------
def _counts_nonneg(x: Ctx, r: RV, e: Z, i: Z) -> Z:
    """``MsgOK``'s clause that no Python predicate can say: no message count is negative
    (a tuple of messages has no negative count; the z3 domain counts in integers, and a
    step that takes a message relies on it)."""
    return A(*(r.net.count(k, e, i) >= 0 for k in KINDS))


# What a conjunct says in z3 beyond its spec predicate (and why: the docstring).
Z3_ONLY: dict[str, SlotFn] = {"MsgOK": _counts_nonneg}


def _and(a: SlotFn, b: SlotFn) -> SlotFn:
    return lambda x, r, e, i: A(a(x, r, e, i), b(x, r, e, i))


def derived(j: Conjunct) -> Conj:
    """The conjunct ``j`` of spec/invariants, traced (with its ``Z3_ONLY`` part)."""
    if j.scope == "global":
        return Conj(j.name, "glob", j.doc, glob=conj_glob(j.pred))
    if j.scope == "request":
        return Conj(j.name, "req", j.doc, req=conj_req(j.pred))
    slot = conj_slot(j.pred, KINDS)
    extra = Z3_ONLY.get(j.name)
    return Conj(j.name, "slot", j.doc, slot=slot if extra is None else _and(slot, extra))


STRENGTHENING: dict[str, Conj] = {name: derived(j) for name, j in INVARIANTS.items()}
