"""Each prefill action's guard, enabled and disabled, on hand-made states.

A row: (action, config, state, request, message, expected). ``expected`` is either a
dict of request-0 fields the successor must have, or ``("refused", PROP)`` /
``("disabled", None)``.
"""

from __future__ import annotations

import pytest

from spec.actions import apply
from spec.common import Refused
from spec.state import (
    AWAIT_READY,
    CANCELLED,
    COMPLETE,
    FAILED,
    FILLING,
    FINISHED,
    IDLE,
    M_ACK,
    M_CHUNK,
    M_DONE,
    M_NACK,
    M_QUIESCED,
    M_READY,
    NONE,
    PREEMPTED,
    PREFILLING,
    QUEUED,
    RUNNING,
    SENDING,
    WRITABLE,
    msg,
)
from tests.spec.spec_helpers import FROZEN, HELD, HO, OFF, RUN_P, SENDING1, R, W, check_guard

CASES = [
    # --- prefill / scheduler -----------------------------------------------------------
    ("PrefillAdmit", HO, W(R()), 0, 0, {"st": PREFILLING, "p": WRITABLE}),
    ("PrefillAdmit", HO, W(RUN_P), 0, 0, ("disabled", None)),
    ("PrefillAdmit", OFF, W(R(), RUN_P), 0, 0, ("refused", "CapacityRefcount")),
    ("PrefillAdmit", OFF, W(R(st=PREEMPTED), R()), 0, 0, {"st": PREFILLING}),
    ("PrefillRun", HO, W(R(st=PREFILLING, p=WRITABLE)), 0, 0, {"st": RUNNING}),
    ("PrefillRun", HO, W(R()), 0, 0, ("disabled", None)),
    ("PrefillDecodeStep", HO, W(RUN_P), 0, 0, {"st": RUNNING, "p": WRITABLE}),
    ("PrefillDecodeStep", HO, W(FROZEN), 0, 0, ("refused", "FrozenSnapshot")),
    ("PrefillFinish", HO, W(RUN_P), 0, 0, {"st": FINISHED, "p": NONE}),
    ("PrefillFinish", HO, W(FROZEN), 0, 0, ("disabled", None)),
    ("PrefillPreempt", OFF, W(RUN_P, R()), 0, 0, {"st": PREEMPTED, "p": NONE, "mv": 1}),
    ("PrefillPreempt", HO, W(RUN_P), 0, 0, ("disabled", None)),  # recompute off
    (
        "PrefillPreempt",
        OFF,
        W(R(st=RUNNING, p=COMPLETE, h=FILLING, mv=1), R()),
        0,
        0,
        ("refused", "NoReuseUnderIO"),
    ),
    ("PrefillOffloadBegin", OFF, W(RUN_P, R()), 0, 0, {"p": COMPLETE, "h": FILLING}),
    (
        "PrefillOffloadBegin",
        OFF,
        W(RUN_P, R(st=RUNNING, h=COMPLETE, hl=2)),
        0,
        0,
        ("refused", "CapacityRefcount"),
    ),
    ("PrefillOffloadCopy", OFF, W(R(st=RUNNING, p=COMPLETE, h=FILLING), R()), 0, 0, {"hl": 1}),
    ("PrefillOffloadCopy", OFF, W(RUN_P, R()), 0, 0, ("disabled", None)),
    (
        "PrefillOffloadCommit",
        OFF,
        W(R(st=RUNNING, p=COMPLETE, h=FILLING, hl=2), R()),
        0,
        0,
        {"h": COMPLETE, "p": NONE},
    ),
    (
        "PrefillOffloadCommit",
        OFF,
        W(R(st=RUNNING, p=COMPLETE, h=FILLING, hl=1), R()),
        0,
        0,
        ("refused", "PublishAfterCommit"),
    ),
    ("PrefillReloadBegin", OFF, W(R(st=RUNNING, h=COMPLETE, hl=2), R()), 0, 0, {"p": FILLING}),
    (
        "PrefillReloadBegin",
        OFF,
        W(R(st=RUNNING, p=COMPLETE, h=FILLING, hl=1), R()),
        0,
        0,
        ("refused", "LoadXorStore"),
    ),
    (
        "PrefillReloadBegin",
        OFF,
        W(R(st=RUNNING, h=COMPLETE, hl=2), RUN_P),
        0,
        0,
        ("refused", "CapacityRefcount"),
    ),
    (
        "PrefillReloadCopy",
        OFF,
        W(R(st=RUNNING, p=FILLING, h=COMPLETE, hl=2), R()),
        0,
        0,
        {"gl": 1},
    ),
    ("PrefillReloadCopy", OFF, W(RUN_P, R()), 0, 0, ("disabled", None)),
    (
        "PrefillReloadCommit",
        OFF,
        W(R(st=RUNNING, p=FILLING, gl=2, h=COMPLETE, hl=2), R()),
        0,
        0,
        {"p": WRITABLE, "h": NONE},
    ),
    (
        "PrefillReloadCommit",
        OFF,
        W(R(st=RUNNING, p=FILLING, gl=1, h=COMPLETE, hl=2), R()),
        0,
        0,
        ("refused", "NoPartialUse"),
    ),
    ("PrefillFreeze", HO, W(RUN_P), 0, 0, {"p": COMPLETE, "ep": 1, "ps": AWAIT_READY}),
    ("PrefillFreeze", HO, W(R(st=RUNNING, p=WRITABLE, ep=2)), 0, 0, ("disabled", None)),
    (
        "PrefillRecvReady",
        HO,
        W(FROZEN._replace(net=(msg(M_READY, 1),))),
        0,
        msg(M_READY, 1),
        {"ps": SENDING, "net": ()},
    ),
    (
        "PrefillRecvReady",
        HO,
        W(R(st=RUNNING, p=COMPLETE, ep=2, ps=AWAIT_READY, net=(msg(M_READY, 1),))),
        0,
        msg(M_READY, 1),
        ("refused", "Fencing"),
    ),
    ("PrefillSendChunk", HO, W(SENDING1), 0, 0, {"sent": 1, "net": (msg(M_CHUNK, 1, 0),)}),
    (
        "PrefillSendChunk",
        HO,
        W(SENDING1._replace(sent=2)),
        0,
        0,
        {"sent": 3, "net": (msg(M_DONE, 1, 0),)},
    ),
    ("PrefillSendChunk", HO, W(SENDING1._replace(st=CANCELLED)), 0, 0, ("disabled", None)),
    (
        "PrefillRelease",
        HO,
        W(HELD._replace(net=(msg(M_ACK, 1),))),
        0,
        msg(M_ACK, 1),
        {"p": NONE, "ps": IDLE},
    ),
    (
        "PrefillRelease",
        HO,
        W(RUN_P._replace(net=(msg(M_ACK, 1),))),
        0,
        msg(M_ACK, 1),
        ("disabled", None),
    ),
    (
        "PrefillResume",
        HO,
        W(HELD._replace(net=(msg(M_NACK, 1),))),
        0,
        msg(M_NACK, 1),
        {"p": WRITABLE, "ps": IDLE},
    ),
    (
        "PrefillResume",
        HO,
        W(HELD._replace(d=FILLING, net=(msg(M_CHUNK, 1, 3), msg(M_NACK, 1)))),
        0,
        msg(M_NACK, 1),
        ("refused", "FrozenSnapshot"),
    ),
    ("PrefillTimeout", HO, W(HELD), 0, 0, {"st": FAILED, "p": NONE, "ps": IDLE}),
    ("PrefillTimeout", HO, W(RUN_P), 0, 0, ("disabled", None)),
    (
        "PrefillQuiesce",
        HO,
        W(HELD._replace(st=CANCELLED)),
        0,
        0,
        {"p": NONE, "ps": IDLE, "net": (msg(M_QUIESCED, 1),)},
    ),
    (
        "PrefillQuiesce",
        HO,
        W(HELD._replace(st=CANCELLED, d=FILLING, net=(msg(M_CHUNK, 1, 0),))),
        0,
        0,
        ("refused", "NoReuseUnderIO"),
    ),
    ("PrefillDiscard", HO, W(R(st=FAILED, net=(msg(M_ACK, 1),))), 0, msg(M_ACK, 1), {"net": ()}),
    (
        "PrefillDiscard",
        HO,
        W(HELD._replace(net=(msg(M_NACK, 1),))),
        0,
        msg(M_NACK, 1),
        ("disabled", None),
    ),
]


@pytest.mark.parametrize(
    "name,c,w,i,arg,expected",
    CASES,
    ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)],
)
def test_guard(name, c, w, i, arg, expected):  # type: ignore[no-untyped-def]
    check_guard(name, c, w, i, arg, expected)


def test_admit_takes_a_queued_request_once() -> None:
    w = apply(W(R(st=QUEUED)), HO, frozenset(), "PrefillAdmit", 0, 0)
    assert not isinstance(w, Refused)
    assert isinstance(apply(w, HO, frozenset(), "PrefillAdmit", 0, 0), Refused)
