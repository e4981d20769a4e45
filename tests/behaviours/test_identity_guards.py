"""Content identity (spec/behaviours/identity.py): guards, the property, the mutants.

Rows in the shape of ``tests/spec/test_guards_decode.py`` (which also counts them in its
every-action-has-both-cases check).
"""

from __future__ import annotations

import pytest

from spec.actions import apply
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import PROPERTIES, violated_safety
from spec.state import (
    AWAIT_READY,
    COMPLETE,
    DF_UNSTAGED,
    FILLING,
    M_CHUNK,
    M_CHUNK_UNSTAGED,
    M_HANDOFF,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
    World,
    msg,
)
from spec.steps import check_step
from tests.spec.spec_helpers import R, W, check_guard

ID = CONFIGS["identity_prefix"]  # blocks=2, prefix=1, cap_d=3, identity on
HO = CONFIGS["handoff_tp2to1"]  # identity off
FROZEN = R(st=RUNNING, p=COMPLETE, ep=1, ps=AWAIT_READY, net=(msg(M_HANDOFF, 1),))
# decode said it holds the 1 prefix block: the sender sends block 1 (chunk 0)
SEND = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=RESERVED, hit=1, phit=1, ps=SENDING)
STALE = {"pfx": True, "pfx_ok": False}

CASES = [
    ("PrefillStage", ID, W(FROZEN, pfx=True), 0, 0, {"stg": 1}),
    ("PrefillStage", ID, W(FROZEN._replace(stg=2), pfx=True), 0, 0, ("disabled", None)),
    ("PrefillStage", HO, W(FROZEN), 0, 0, ("disabled", None)),  # no staging in this world
    ("PrefillStage", ID, W(R(st=RUNNING, p=WRITABLE)), 0, 0, ("disabled", None)),
    ("DecodeRecyclePrefix", ID, W(R(), pfx=True), 0, 0, {}),
    (
        "DecodeRecyclePrefix",
        ID,
        W(R(st=RUNNING, d=RESERVED, hit=1), pfx=True, pfx_ref=1),
        0,
        0,
        ("refused", "CapacityRefcount"),
    ),
    ("DecodeRecyclePrefix", ID, W(R(), **STALE), 0, 0, ("disabled", None)),
    ("DecodeRecyclePrefix", HO, W(R(), pfx=True), 0, 0, ("disabled", None)),
    # the sender sends only a staged block (block 1 needs stg >= 2)
    (
        "PrefillSendChunk",
        ID,
        W(SEND._replace(stg=1), pfx=True, pfx_ref=1),
        0,
        0,
        ("refused", "ContentIdentity"),
    ),
    ("PrefillSendChunk", ID, W(SEND._replace(stg=2), pfx=True, pfx_ref=1), 0, 0, {"sent": 1}),
    # a stale index entry is a miss: the whole request is sent
    ("DecodeReserve", ID, W(FROZEN, **STALE), 0, msg(M_HANDOFF, 1), {"d": RESERVED, "hit": 0}),
    ("DecodeReserve", ID, W(FROZEN, pfx=True), 0, msg(M_HANDOFF, 1), {"hit": 1}),
]

# (property, config, a state that breaks it, one that does not): see test_spec_properties
GOOD = R(st=RUNNING, d=COMPLETE, dep=1, hit=1, landed=1, rmask=1)
PROPERTY_CASES = [
    (
        "ContentIdentity",
        ID,
        W(GOOD, pfx=True, pfx_ref=1, pfx_ok=False),
        W(GOOD, pfx=True, pfx_ref=1),
    ),
    (
        "ContentIdentity",
        ID,
        W(GOOD._replace(dfl=DF_UNSTAGED), pfx=True, pfx_ref=1),
        W(GOOD._replace(d=FILLING, dfl=DF_UNSTAGED), pfx=True, pfx_ref=1),
    ),
]

# (property, config, a step that breaks it, one that does not): see tests/spec/test_steps
_S1, _S2 = SEND._replace(stg=1), SEND._replace(stg=2)
STEP_CASES = [
    (
        "ContentIdentity",  # block 1 sent with only block 0 staged
        ID,
        (
            W(_S1, pfx=True, pfx_ref=1),
            "PrefillSendChunk",
            0,
            0,
            W(_S1._replace(sent=1, net=(msg(M_CHUNK_UNSTAGED, 1, 0),)), pfx=True, pfx_ref=1),
        ),
        (
            W(_S2, pfx=True, pfx_ref=1),
            "PrefillSendChunk",
            0,
            0,
            W(_S2._replace(sent=1, net=(msg(M_CHUNK, 1, 0),)), pfx=True, pfx_ref=1),
        ),
    ),
]


def test_fast_path_is_sound_with_staging() -> None:
    """step_plain claims 'nothing can fail' only where every predicate holds."""
    from model_checks.explicit.explore import explore
    from spec.actions import successors
    from spec.steps import STEP_PREDS, step_plain

    for m in (frozenset(), frozenset({"unstaged_block_advertised"})):
        for w in explore(ID, m).states:
            for name, i, arg, s in successors(w, ID, m):
                if step_plain(w, name, i, arg, s, ID):
                    assert all(p(w, name, i, arg, s, ID) for _, p in STEP_PREDS), (name, w)


@pytest.mark.parametrize("row", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_guard(row) -> None:  # type: ignore[no-untyped-def]
    check_guard(*row)


def test_recycle_only_flips_the_content_bit() -> None:
    w = W(R(), pfx=True)
    s = apply(w, ID, frozenset(), "DecodeRecyclePrefix", 0, 0)
    assert isinstance(s, World) and s == w._replace(pfx_ok=False)


def test_hash_unchecked_takes_a_foreign_hit_and_validates_it() -> None:
    m = frozenset({"prefix_hash_unchecked"})
    s = apply(W(FROZEN, **STALE), ID, m, "DecodeReserve", 0, msg(M_HANDOFF, 1))
    assert isinstance(s, World) and s.reqs[0].hit == 1 and s.pfx_ref == 1
    held = W(R(st=RUNNING, d=COMPLETE, dep=1, hit=1, landed=1, rmask=1), pfx=True, pfx_ref=1)
    assert "ContentIdentity" not in violated_safety(held, ID)
    assert "ContentIdentity" in violated_safety(held._replace(pfx_ok=False), ID)


def test_unstaged_chunk_lands_unseen_and_breaks_the_property() -> None:
    m = frozenset({"unstaged_block_advertised"})
    pre = W(SEND._replace(stg=1), pfx=True, pfx_ref=1)
    s = apply(pre, ID, m, "PrefillSendChunk", 0, 0)
    assert isinstance(s, World) and msg(M_CHUNK_UNSTAGED, 1, 0) in s.reqs[0].net
    assert check_step(pre, "PrefillSendChunk", 0, 0, s, ID) == ["ContentIdentity"]
    assert "ContentIdentity" in violated_safety(s, ID)
    # decode cannot tell it from a good chunk: it lands, and validation passes
    r = s.reqs[0]._replace(ps=SENDING)
    land = apply(s._replace(reqs=(r,)), ID, m, "DecodeReceiveChunk", 0, msg(M_CHUNK_UNSTAGED, 1, 0))
    assert isinstance(land, World)
    assert land.reqs[0].d == FILLING and land.reqs[0].dfl & DF_UNSTAGED


def test_a_staged_send_passes_the_step_check() -> None:
    pre = W(SEND._replace(stg=2), pfx=True, pfx_ref=1)
    s = apply(pre, ID, frozenset(), "PrefillSendChunk", 0, 0)
    assert isinstance(s, World) and msg(M_CHUNK, 1, 0) in s.reqs[0].net
    assert check_step(pre, "PrefillSendChunk", 0, 0, s, ID) == []


def test_the_property_is_registered_as_safety() -> None:
    p = PROPERTIES["ContentIdentity"]
    assert p.kind == "safety" and p.pred is not None
    assert not isinstance(apply(W(R()), ID, frozenset(), "ClientCancel", 0, 0), Refused)


def test_commit_of_a_foreign_prefix_is_caught_in_the_writable_state() -> None:
    w = W(R(st=RUNNING, d=WRITABLE, dep=1, hit=1, landed=1, rmask=1), pfx=True, pfx_ref=1)
    assert violated_safety(w._replace(pfx_ok=False), ID) == ["ContentIdentity"]
