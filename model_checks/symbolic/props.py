"""The 13 safety predicates of ``spec/properties.py`` in z3, traced from the spec's own
predicates (``tracer.predicate``): none is written again here.

Each property is split by scope, so both domains can quantify it their own way:
``glob`` (globals and pool usage), ``req`` (one request) and ``msg`` (one message of a
request in flight, of a concrete kind). A state satisfies the property when ``glob``
holds, ``req`` holds for every request and ``msg`` for every message in flight. Each
scope is the spec predicate itself, run on a world of no request, of the one request
with no message, and of the one request with the one message (the split is exact for a
predicate that reads the other requests only through spec.common's pool helpers, and
loops over requests and their messages as a conjunction: tests/symbolic/test_props_derived
checks it against the spec on explored states).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from model_checks.symbolic.core import RV, A, Ctx, O, Z
from model_checks.symbolic.finite import FCtx
from model_checks.symbolic.tracer.predicate import prop_glob, prop_msg, prop_req
from spec.properties import SAFETY, Pred
from spec.state import M_CHUNK_UNSTAGED, msg_epoch, msg_idx, msg_inc, msg_kind

__all__ = ["MSG_KINDS", "SUPPORT", "ZPROPS", "ZProp", "finite_holds"]

# The message kinds a property's ``msg`` scope is built for (every kind the encodings
# count, spec.state): a kind whose message changes nothing traces to the ``req`` scope
# and is dropped where the formula is built (``msg_part``).
MSG_KINDS: frozenset[int] = frozenset((*range(1, 10), M_CHUNK_UNSTAGED))


@dataclass(frozen=True)
class ZProp:
    id: str
    pred: Pred
    msg_kinds: frozenset[int] = MSG_KINDS

    def glob(self, x: Ctx) -> Z:
        return prop_glob(self.pred, x)

    def req(self, x: Ctx, r: RV) -> Z:
        return prop_req(self.pred, x, r)[0]

    def req_reads(self, x: Ctx, r: RV) -> tuple[Z, bool]:
        """``req``, and whether the predicate reads the request's messages at all."""
        return prop_req(self.pred, x, r)

    def msg(self, x: Ctx, r: RV, kind: int, e: Z, i: Z, inc: Z = 0) -> Z:
        return prop_msg(self.pred, x, r, kind, e, i, inc)

    def msg_part(self, x: Ctx, r: RV, kind: int, e: Z, i: Z, req: Z, inc: Z = 0) -> Z | None:
        """``msg``, or None where it is ``req`` itself (a message that changes nothing)."""
        t = self.msg(x, r, kind, e, i, inc)
        if (
            t is True
            or t is req
            or (isinstance(t, z3.ExprRef) and isinstance(req, z3.ExprRef) and z3.eq(t, req))
        ):
            return None
        return t


ZPROPS: dict[str, ZProp] = {p.id: ZProp(p.id, p.pred) for p in SAFETY if p.pred is not None}


def finite_holds(enc: Any, zp: ZProp, s: Any) -> Z:
    """``zp`` at the state ``s`` of the finite encoding ``enc`` (``encoding.Encoding``,
    which caches it on its template state): the global scope, every request's scope,
    and a message scope for every code a request may hold (traced once per kind at
    symbolic epoch, index and incarnation, then renamed per code)."""
    x = FCtx(enc, s)
    parts = [zp.glob(x)]
    for i in range(enc.c.n_reqs):
        r = enc.view(s, i)
        req, reads = zp.req_reads(x, r)
        parts.append(req)
        if not reads:  # the predicate never looks at the request's messages
            continue
        e, j = enc.scalar(f"msg_e@{s.tag}"), enc.scalar(f"msg_i@{s.tag}")
        n = enc.scalar(f"msg_n@{s.tag}") if enc.c.restarts else 0
        for kind in sorted(zp.msg_kinds & {msg_kind(code) for code in enc.codes}):
            ok = zp.msg_part(x, r, kind, e, j, req, n)
            if ok is None:
                continue
            for code in enc.codes:
                if msg_kind(code) == kind:
                    at = ((e, enc.num(msg_epoch(code))), (j, enc.num(msg_idx(code))))
                    at += ((n, enc.num(msg_inc(code))),) if enc.c.restarts else ()
                    term = z3.substitute(ok, *at) if isinstance(ok, z3.ExprRef) else ok
                    parts.append(O(s[("n", i, code)] == 0, term))
    return A(*parts)


assert tuple(ZPROPS) == tuple(p.id for p in SAFETY), "z3 properties out of step with spec"

# Per property: the strengthening conjuncts (``invariants.STRENGTHENING``, by name) its
# induction proof uses.
_HANDOFF = (
    "TypeOK",
    "MsgOK",
    "Frozen",
    "DecodeEpoch",
    "DecodeCurrent",
    "DecodeLiveSource",
    "IdleSeen",
    "HandoffFresh",
    "NackGaveUp",
    "AckCommitted",
    "TurnIdle",
    "TurnQuiet",
)
_IO = (
    "SameHit",
    "ReadyMatches",
    "QuiescedStopped",
    "ChunkOnce",
    "LandedSent",
    "ChunksHaveHome",
    "StepHeld",
    "NoUnstaged",
)
# Per property: the conjuncts its proof uses (from minimized unsat cores, closed under
# the same relation; spec/INVARIANTS.md explains each). Property IDs may support others.
SUPPORT: dict[str, tuple[str, ...]] = {
    "SingleWriter": _HANDOFF,
    "NoPartialUse": (),
    "NothingLost": (*_HANDOFF, "SingleWriter", "DownEmpty"),
    "FrozenSnapshot": ("StepHeld", *_HANDOFF),
    "Fencing": (),
    "NoReuseUnderIO": (
        *_HANDOFF,
        *_IO,
        "SingleWriter",
        "NothingLost",
        "NoPartialUse",
        "DownEmpty",
    ),
    "StickyEnd": ("FailedNeedsSwitch",),
    "ManifestGate": (),
    "CapacityRefcount": (*_HANDOFF, "SingleWriter"),
    "RankAgreement": (),
    "PublishAfterCommit": (),
    "LoadXorStore": (),
    "ContentIdentity": ("PrefixOwn", "StagedOnly", "NoUnstaged", *_HANDOFF),
}
