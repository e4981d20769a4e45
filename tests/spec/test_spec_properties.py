"""Each safety property on a state that breaks it and on one that does not; the
liveness goal predicates likewise."""

from __future__ import annotations

import pytest

from spec.config import CONFIGS
from spec.properties import PROPERTIES, SAFETY, quiescent_terminal, violated_safety
from spec.state import (
    AWAIT_ACK,
    CANCELLED,
    COMPLETE,
    DF_CORRUPT,
    DF_FENCED,
    DF_MISMATCH,
    FAILED,
    FILLING,
    FINISHED,
    G_END_CANCELLED,
    G_END_FAILED,
    G_FROZEN_WRITE,
    G_POSTEND,
    G_STALE,
    IDLE,
    M_CHUNK,
    NONE,
    PREFILLING,
    QUARANTINED,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
    msg,
)
from tests.behaviours.test_identity_guards import PROPERTY_CASES as IDENTITY_CASES
from tests.behaviours.test_stream import PROPERTY_CASES as STREAM_CASES
from tests.spec.spec_helpers import R, W

HO = CONFIGS["handoff_tp2to1"]
OFF = CONFIGS["offload_contend"]
PFX = CONFIGS["prefix_share"]

GOOD_D = R(st=RUNNING, d=WRITABLE, dep=1, ep=1, landed=0b1111, rmask=0b11)
CHUNK = msg(M_CHUNK, 1, 0)
IN_FLIGHT = R(st=RUNNING, p=COMPLETE, ep=1, ps=SENDING, d=FILLING, dep=1, net=(CHUNK,))

# (property, config, a state that breaks it, a similar state that does not)
CASES = [
    ("SingleWriter", HO, W(GOOD_D._replace(p=WRITABLE)), W(GOOD_D)),
    ("NoPartialUse", HO, W(GOOD_D._replace(landed=0b0111)), W(GOOD_D)),
    ("NoPartialUse", HO, W(GOOD_D._replace(dfl=DF_CORRUPT)), W(GOOD_D)),
    (
        "NothingLost",
        HO,
        W(R(st=RUNNING, d=FILLING, dep=1)),
        W(R(st=RUNNING, p=COMPLETE, d=FILLING)),
    ),
    (  # a prefilling request whose blocks are gone: lost, though not yet running
        "NothingLost",
        HO,
        W(R(st=PREFILLING)),
        W(R(st=PREFILLING, p=WRITABLE)),
    ),
    (  # admitted on a crashed prefill: its writable copy is a ghost (PrefillAdmit's p_up)
        "NothingLost",
        HO,
        W(R(st=PREFILLING, p=WRITABLE), p_up=False),
        W(R(st=PREFILLING, p=WRITABLE)),
    ),
    (  # a committed copy on a crashed decode is no copy either
        "NothingLost",
        HO,
        W(GOOD_D, d_up=False),
        W(GOOD_D._replace(p=COMPLETE), d_up=False, p_up=True),
    ),
    ("FrozenSnapshot", HO, W(GOOD_D._replace(g=G_FROZEN_WRITE)), W(GOOD_D)),
    ("Fencing", HO, W(GOOD_D._replace(g=G_STALE)), W(GOOD_D)),
    ("NoReuseUnderIO", HO, W(IN_FLIGHT._replace(d=NONE)), W(IN_FLIGHT)),
    (
        "NoReuseUnderIO",
        HO,
        W(IN_FLIGHT._replace(p=NONE, ps=IDLE)),
        W(IN_FLIGHT._replace(d=QUARANTINED)),
    ),
    (
        "NoReuseUnderIO",
        HO,
        W(IN_FLIGHT._replace(d=NONE)),
        W(IN_FLIGHT._replace(d=NONE, dfl=DF_FENCED)),
    ),
    (
        "NoReuseUnderIO",
        OFF,
        W(R(st=RUNNING, h=FILLING), R()),
        W(R(st=RUNNING, p=COMPLETE, h=FILLING), R()),
    ),
    (
        "StickyEnd",
        HO,
        W(GOOD_D._replace(g=G_END_FAILED)),
        W(GOOD_D._replace(st=FAILED, g=G_END_FAILED)),
    ),
    (
        "StickyEnd",
        HO,
        W(GOOD_D._replace(st=CANCELLED, g=G_END_CANCELLED | G_POSTEND)),
        W(GOOD_D._replace(st=CANCELLED, g=G_END_CANCELLED)),
    ),
    (
        "ManifestGate",
        HO,
        W(GOOD_D._replace(dfl=DF_MISMATCH)),
        W(GOOD_D._replace(d=RESERVED, dfl=DF_MISMATCH)),
    ),
    (
        "CapacityRefcount",
        OFF,
        W(R(st=RUNNING, p=WRITABLE), R(st=RUNNING, p=WRITABLE)),
        W(R(st=RUNNING, p=WRITABLE), R()),
    ),
    (
        "CapacityRefcount",
        PFX,
        W(R(st=RUNNING, d=RESERVED, hit=1), R(), pfx=True, pfx_ref=0),
        W(R(st=RUNNING, d=RESERVED, hit=1), R(), pfx=True, pfx_ref=1),
    ),
    (
        "CapacityRefcount",
        PFX,
        W(R(st=RUNNING, d=RESERVED, hit=1), R(), pfx=False, pfx_ref=1),
        W(R(st=RUNNING, d=RESERVED, hit=1), R(), pfx=True, pfx_ref=1),
    ),
    (
        "RankAgreement",
        HO,
        W(GOOD_D._replace(rmask=0b01)),
        W(GOOD_D._replace(d=FILLING, rmask=0b01)),
    ),
    (
        "PublishAfterCommit",
        OFF,
        W(R(st=RUNNING, h=COMPLETE, hl=1), R()),
        W(R(st=RUNNING, h=COMPLETE, hl=2), R()),
    ),
    (
        "LoadXorStore",
        OFF,
        W(R(st=RUNNING, p=FILLING, h=FILLING), R()),
        W(R(st=RUNNING, p=FILLING, h=COMPLETE, hl=2), R()),
    ),
]
CASES += IDENTITY_CASES
CASES += STREAM_CASES


@pytest.mark.parametrize("pid,c,bad,good", CASES, ids=[f"{x[0]}-{k}" for k, x in enumerate(CASES)])
def test_property(pid, c, bad, good):  # type: ignore[no-untyped-def]
    pred = PROPERTIES[pid].pred
    assert pred is not None
    assert not pred(bad, c)
    assert pred(good, c)
    assert pid in violated_safety(bad, c)


def test_every_safety_property_has_cases() -> None:
    assert {p.id for p in SAFETY} == {x[0] for x in CASES}


def test_initial_states_break_nothing() -> None:
    for c in CONFIGS.values():
        assert violated_safety(c.initial(), c) == []


def test_quiescent_terminal_goal() -> None:
    assert quiescent_terminal(W(R(st=FINISHED), R(st=CANCELLED)), OFF)
    assert not quiescent_terminal(W(R(st=FINISHED, d=QUARANTINED)), HO)
    assert not quiescent_terminal(W(R(st=FAILED, net=(CHUNK,))), HO)
    assert not quiescent_terminal(W(R(st=FAILED, ps=AWAIT_ACK)), HO)
    assert not quiescent_terminal(W(R(st=RUNNING)), HO)


def test_pool_counts_are_recounted_from_the_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    """CapacityRefcount recounts the pools: a counter that misses a holder (the
    ``used_p`` mutant that counts only given-back stream sources) admits past capacity
    and reads as within it; the recount sees the two writable copies."""
    import spec.properties as props

    two = W(R(st=RUNNING, p=WRITABLE), R(st=RUNNING, p=WRITABLE))
    one = W(R(st=RUNNING, p=WRITABLE), R())
    assert props.capacity_refcount(one, OFF) and props.pools_recounted(two, OFF)
    monkeypatch.setattr(props, "used_p", lambda w, c: 0)
    assert not props.pools_recounted(one, OFF)
    assert "CapacityRefcount" in violated_safety(one, OFF)
