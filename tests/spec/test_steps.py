"""The transition predicates of spec/steps.py: each on a step that breaks it and on a
similar step that does not; the explorer's fast path against the full predicates; the
mutants that only a step predicate can catch."""

from __future__ import annotations

import pytest

from model_checks.explicit.explore import explore
from model_checks.explicit.runner import check_config, check_mutant
from spec.actions import successors
from spec.common import take
from spec.state import (
    CANCELLED,
    COMPLETE,
    FILLING,
    M_CHUNK,
    M_DONE,
    M_NACK,
    RUNNING,
    SENDING,
    WRITABLE,
    World,
    msg,
)
from spec.steps import STEP_PREDS, check_step, step_plain
from tests.behaviours.test_identity_guards import STEP_CASES as IDENTITY_STEP_CASES
from tests.spec.spec_helpers import ALL_SENT, HO, OFF, PFX, SENDING1, R, W

DONE0 = msg(M_DONE, 1, 0)
RX = SENDING1._replace(d=FILLING, net=(DONE0,))
NACK_OLD = msg(M_NACK, 1)
EP2 = R(st=RUNNING, p=COMPLETE, ep=2, dep=2, ps=SENDING, net=(NACK_OLD,))

Step = tuple[World, str, int, int, World]
# (property, config, a step that breaks it, a similar step that does not)
CASES: list[tuple[str, object, Step, Step]] = [
    (
        "FrozenSnapshot",  # a write to a frozen source (a self-loop)
        HO,
        (W(ALL_SENT), "PrefillDecodeStep", 0, 0, W(ALL_SENT)),
        (W(R(st=RUNNING, p=WRITABLE)), "PrefillDecodeStep", 0, 0, W(R(st=RUNNING, p=WRITABLE))),
    ),
    (
        "FrozenSnapshot",  # decode writes a validated but uncommitted replica
        HO,
        (W(ALL_SENT._replace(d=COMPLETE)), "DecodeStep", 0, 0, W(ALL_SENT._replace(d=COMPLETE))),
        (
            W(ALL_SENT._replace(d=WRITABLE, p=COMPLETE)),
            "DecodeStep",
            0,
            0,
            W(ALL_SENT._replace(d=WRITABLE, p=COMPLETE)),
        ),
    ),
    (
        "FrozenSnapshot",  # a chunk lands in the shared prefix block (hit=1 of 1)
        PFX,
        (
            W(R(st=RUNNING, d=FILLING, dep=1, hit=1, net=(msg(M_CHUNK, 1, 0),)), pfx=True),
            "DecodeReceiveChunk",
            0,
            msg(M_CHUNK, 1, 0),
            W(R(st=RUNNING, d=FILLING, dep=1, hit=1, landed=1), pfx=True),
        ),
        (
            W(R(st=RUNNING, d=FILLING, dep=1, net=(msg(M_CHUNK, 1, 0),))),
            "DecodeReceiveChunk",
            0,
            msg(M_CHUNK, 1, 0),
            W(R(st=RUNNING, d=FILLING, dep=1, landed=1)),
        ),
    ),
    (
        "Fencing",  # a Nack of epoch 1 thaws an epoch-2 source
        HO,
        (W(EP2), "PrefillResume", 0, NACK_OLD, W(EP2._replace(p=WRITABLE, ps=0, net=()))),
        (W(EP2), "PrefillDiscard", 0, NACK_OLD, W(EP2._replace(net=()))),
    ),
    (
        "StickyEnd",  # decode validates a cancelled request
        HO,
        (
            W(ALL_SENT._replace(st=CANCELLED)),
            "DecodeValidate",
            0,
            0,
            W(ALL_SENT._replace(st=CANCELLED, d=COMPLETE)),
        ),
        (W(ALL_SENT), "DecodeValidate", 0, 0, W(ALL_SENT._replace(d=COMPLETE))),
    ),
    (
        "StickyEnd",  # a chunk is sent for a cancelled request
        HO,
        (
            W(SENDING1._replace(st=CANCELLED)),
            "PrefillSendChunk",
            0,
            0,
            W(SENDING1._replace(st=CANCELLED, sent=1, net=(msg(M_CHUNK, 1, 0),))),
        ),
        (
            W(SENDING1),
            "PrefillSendChunk",
            0,
            0,
            W(SENDING1._replace(sent=1, net=(msg(M_CHUNK, 1, 0),))),
        ),
    ),
    (
        "StickyEnd",  # a failed request is set running again
        HO,
        (W(R(st=6, d=COMPLETE)), "DecodeCommit", 0, 0, W(R(st=RUNNING, d=WRITABLE))),
        (W(R(st=RUNNING, d=COMPLETE)), "DecodeCommit", 0, 0, W(R(st=RUNNING, d=WRITABLE))),
    ),
    (
        "NoPartialUse",  # a reload commits with one of two blocks back
        OFF,
        (
            W(R(st=RUNNING, p=FILLING, gl=1), R()),
            "PrefillReloadCommit",
            0,
            0,
            W(R(st=RUNNING, p=WRITABLE), R()),
        ),
        (
            W(R(st=RUNNING, p=FILLING, gl=2), R()),
            "PrefillReloadCommit",
            0,
            0,
            W(R(st=RUNNING, p=WRITABLE), R()),
        ),
    ),
    (
        "RankAgreement",  # rank 1 counted from rank 0's RankDone
        HO,
        (W(RX), "DecodeReceiveDone", 0, DONE0, W(RX._replace(rmask=0b10, net=()))),
        (W(RX), "DecodeReceiveDone", 0, DONE0, W(RX._replace(rmask=0b01, net=()))),
    ),
    (
        "RankAgreement",  # a rank marked done with no RankDone consumed
        HO,
        (W(RX), "DecodeValidate", 0, 0, W(RX._replace(rmask=0b11))),
        (W(RX), "DecodeValidate", 0, 0, W(RX._replace(d=COMPLETE))),
    ),
]

CASES += IDENTITY_STEP_CASES


@pytest.mark.parametrize("pid,c,bad,good", CASES, ids=[f"{x[0]}-{k}" for k, x in enumerate(CASES)])
def test_step_property(pid, c, bad, good):  # type: ignore[no-untyped-def]
    assert pid in check_step(*bad, c)
    assert check_step(*good, c) == []


def test_every_step_property_has_cases() -> None:
    assert {pid for pid, _ in STEP_PREDS} == {x[0] for x in CASES}


@pytest.mark.parametrize(
    "cname,mutants",
    [
        ("handoff_crash", frozenset()),
        ("offload_contend", frozenset()),
        ("offload_contend", frozenset({"failed_store_visible"})),
    ],
)
def test_fast_path_is_sound(cname, mutants):  # type: ignore[no-untyped-def]
    """step_plain claims 'nothing can fail' only where every predicate holds."""
    from spec.config import get_config

    c = get_config(cname)
    g = explore(c, mutants)
    for w in g.states:
        for name, i, arg, s in successors(w, c, mutants):
            if step_plain(w, name, i, arg, s, c):
                assert all(p(w, name, i, arg, s, c) for _, p in STEP_PREDS), (name, w)


def test_take_keeps_a_stale_step_legal() -> None:
    w = W(EP2)
    assert (
        check_step(
            w, "PrefillDiscard", 0, NACK_OLD, W(EP2._replace(net=take(EP2.net, NACK_OLD))), HO
        )
        == []
    )


def test_correct_spec_breaks_no_step_property() -> None:
    for cname in ("handoff_crash", "offload_contend"):
        assert check_config(cname, liveness=False).violations == {}


@pytest.mark.xdist_group("mutant:source_writes_while_frozen")  # shares check_mutant's cache
def test_step_counterexample_ends_with_the_bad_step() -> None:
    """source_writes_while_frozen: the write is the last step of the counterexample.

    ``check_mutant``'s BFS stops at the first FrozenSnapshot violation (the same shortest
    counterexample as a full exploration of handoff_tp2to1, which cost 74 s here), and
    its result is shared with the mutant's other tests on the same worker."""
    r = check_mutant("source_writes_while_frozen")
    assert r.config == "handoff_tp2to1" and r.caught and r.trace is not None
    assert r.trace.steps[-1]["action"] == "PrefillDecodeStep"
