"""z3 mirror of the 13 safety predicates of ``spec/properties.py`` (same IDs).

Each property is split by scope, so both domains can quantify it their own way:
``glob`` (globals and pool usage), ``req`` (one request) and ``msg`` (one message of a
request in flight, of a concrete kind). A state satisfies the property when ``glob``
holds, ``req`` holds for every request and ``msg`` for every message in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from model_checks.symbolic.behaviours.async_steps import steps_held, steps_write_writable
from model_checks.symbolic.core import IN, RV, A, Ctx, N, O, Z, flag
from model_checks.symbolic.tracer.predicate import over_reqs, per_req, req_of
from spec.behaviours.host_cache import (
    HK_LOAD,
    host_io_ok,
    host_pins_exact,
    host_published_whole,
)
from spec.behaviours.turns import turns_identity, turns_kept, turns_single_writer
from spec.properties import SAFETY
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
    G_END_CANCELLED,
    G_END_FAILED,
    G_FOREIGN,
    G_FROZEN_WRITE,
    G_POSTEND,
    G_STALE,
    IDLE,
    M_CHUNK_UNSTAGED,
    PREFILLING,
    QUARANTINED,
    RESERVED,
    RUNNING,
    WRITABLE,
)

HELD = (COMPLETE, WRITABLE)
MsgPred = Callable[[Ctx, RV, int, Z, Z], Z]


def _true_glob(x: Ctx) -> Z:
    return True


def _true_msg(x: Ctx, r: RV, kind: int, e: Z, i: Z) -> Z:
    return True


@dataclass(frozen=True)
class ZProp:
    id: str
    req: Callable[[Ctx, RV], Z]
    glob: Callable[[Ctx], Z] = _true_glob
    msg: MsgPred = _true_msg
    msg_kinds: frozenset[int] = frozenset()  # kinds ``msg`` constrains


ReqPart = Callable[[Ctx, RV], Z]
GlobPart = Callable[[Ctx], Z]


def derived(zp: ZProp, req: tuple[ReqPart, ...] = (), glob: tuple[GlobPart, ...] = ()) -> ZProp:
    """``zp`` with the parts traced from the spec's own predicates (``tracer.predicate``)
    added: the behaviours' parts (the shared host cache, turns)."""
    r0, g0 = zp.req, zp.glob
    return ZProp(
        zp.id,
        lambda x, r: A(r0(x, r), *(f(x, r) for f in req)),
        lambda x: A(g0(x), *(f(x) for f in glob)),
        zp.msg,
        zp.msg_kinds,
    )


def _pins_exact(w: object, c: object) -> bool:
    return host_pins_exact(w)  # type: ignore[arg-type]


def _reuse_msg(x: Ctx, r: RV, kind: int, e: Z, i: Z) -> Z:
    if kind not in CHUNKS:
        return True
    source = A(r.ps != IDLE, r.ep == e, r.p == COMPLETE)
    held = A(r.dep == e, IN(r.d, (RESERVED, FILLING, QUARANTINED)))
    fenced = A(x.c.revocable, r.dep == e, flag(r.dfl, DF_FENCED))  # no revoke: no fence
    return A(source, O(held, fenced))


def _ranks(x: Ctx, r: RV) -> Z:
    """Every source rank for a validated replica; with decode ranks (``dst_full``), every
    decode rank installed for a committed one, none without a validated one."""
    dst = x.c.dst_full
    return A(
        N(A(IN(r.d, HELD), r.rmask != x.rfull())),
        N(A(r.d == WRITABLE, r.dmask != dst)),
        O(r.dmask == 0, IN(r.d, HELD)),
        (r.dmask & ~dst) == 0 if isinstance(r.dmask, z3.ExprRef) else not r.dmask & ~dst,
    )


def _capacity(x: Ctx) -> Z:
    c = x.c
    return A(
        x.used_p() <= c.cap_p,
        x.used_d() <= c.cap_d,
        x.used_h() <= c.cap_h,
        x.pfx_ref == x.refs(),
        x.pfx_ref >= 0,
        O(x.pfx_ref == 0, x.pfx),
    )


ZPROPS: dict[str, ZProp] = {
    p.id: p
    for p in (
        derived(
            ZProp("SingleWriter", lambda x, r: N(A(r.p == WRITABLE, r.d == WRITABLE))),
            req=(per_req(turns_single_writer),),
        ),
        ZProp(
            "NoPartialUse",
            lambda x, r: O(
                N(IN(r.d, HELD)), A(x.lfull(r.landed, r.hit), N(flag(r.dfl, DF_CORRUPT)))
            ),
        ),
        derived(
            ZProp(
                "NothingLost",
                lambda x, r: O(
                    N(IN(r.st, (PREFILLING, RUNNING))),
                    IN(r.p, HELD),
                    IN(r.d, HELD),
                    r.h == COMPLETE,
                ),
            ),
            req=(per_req(turns_kept),),
        ),
        ZProp(
            "FrozenSnapshot",
            lambda x, r: A(N(flag(r.g, G_FROZEN_WRITE)), steps_write_writable(x, r)),
        ),
        ZProp("Fencing", lambda x, r: N(flag(r.g, G_STALE))),
        derived(
            ZProp(
                "NoReuseUnderIO",
                lambda x, r: A(
                    N(flag(r.g, G_FOREIGN)),
                    N(A(r.h == FILLING, r.p != COMPLETE)),
                    N(A(r.p == FILLING, N(IN(r.h, (COMPLETE, FILLING))), r.hk != HK_LOAD)),
                    steps_held(x, r),
                ),
                msg=_reuse_msg,
                msg_kinds=frozenset(CHUNKS),
            ),
            req=(req_of(host_io_ok),),
        ),
        ZProp(
            "StickyEnd",
            lambda x, r: A(
                N(flag(r.g, G_POSTEND)),
                O(N(flag(r.g, G_END_CANCELLED)), r.st == CANCELLED),
                O(N(flag(r.g, G_END_FAILED)), r.st == FAILED),
                N(A(IN(r.d, HELD), flag(r.dfl, DF_FAILED))),
            ),
        ),
        ZProp("ManifestGate", lambda x, r: N(A(IN(r.d, HELD), flag(r.dfl, DF_MISMATCH)))),
        derived(
            ZProp("CapacityRefcount", lambda x, r: True, glob=_capacity),
            glob=(over_reqs(_pins_exact),),
        ),
        ZProp("RankAgreement", _ranks),
        derived(
            ZProp("PublishAfterCommit", lambda x, r: N(A(r.h == COMPLETE, r.hl != x.c.blocks))),
            glob=(over_reqs(host_published_whole),),
        ),
        ZProp("LoadXorStore", lambda x, r: N(A(r.p == FILLING, r.h == FILLING))),
        derived(
            ZProp(
                "ContentIdentity",
                lambda x, r: N(
                    A(IN(r.d, HELD), O(flag(r.dfl, DF_UNSTAGED), A(r.hit > 0, N(x.pfx_ok))))
                ),
                msg=lambda x, r, kind, e, i: N(x.c.identity),  # no ChunkUnstaged in flight
                msg_kinds=frozenset({M_CHUNK_UNSTAGED}),
            ),
            req=(per_req(turns_identity),),
        ),
    )
}

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
    "NothingLost": (*_HANDOFF, "SingleWriter"),
    "FrozenSnapshot": ("StepHeld",),
    "Fencing": (),
    "NoReuseUnderIO": (*_HANDOFF, *_IO, "SingleWriter", "NothingLost", "NoPartialUse"),
    "StickyEnd": ("FailedNeedsSwitch",),
    "ManifestGate": (),
    "CapacityRefcount": (*_HANDOFF, "SingleWriter"),
    "RankAgreement": (),
    "PublishAfterCommit": (),
    "LoadXorStore": (),
    "ContentIdentity": ("PrefixOwn", "StagedOnly", "NoUnstaged"),
}
