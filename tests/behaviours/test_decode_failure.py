"""Decode-side failure (spec/behaviours/decode_failure.py): guards, StickyEnd, the mutant."""

from __future__ import annotations

import json

import pytest

from model_checks.conformance import LogError, check_text
from spec.actions import apply
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    DF_FAILED,
    DF_FENCED,
    FILLING,
    M_CHUNK,
    M_HANDOFF,
    M_NACK,
    NONE,
    RESERVED,
    RUNNING,
    WRITABLE,
    World,
    msg,
)
from spec.steps import check_step
from tests.spec.spec_helpers import HO, SENDING1, R, W, check_guard

DF = CONFIGS["handoff_decode_fail"]  # one request, 2 blocks, src_tp=1: chunks 0b11, rank 0b1
LOADED = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=FILLING, ps=AWAIT_ACK, landed=0b11, rmask=1)
FAILED_LOADED = LOADED._replace(dfl=DF_FAILED)

CASES = [
    ("DecodeFail", DF, W(SENDING1), 0, 0, {"dfl": DF_FAILED, "d": RESERVED}),
    ("DecodeFail", DF, W(LOADED), 0, 0, {"dfl": DF_FAILED, "d": FILLING}),
    ("DecodeFail", HO, W(SENDING1), 0, 0, ("disabled", None)),  # the switch is off
    ("DecodeFail", DF, W(FAILED_LOADED), 0, 0, ("disabled", None)),  # failed already
    ("DecodeFail", DF, W(LOADED._replace(d=WRITABLE)), 0, 0, ("disabled", None)),
    ("DecodeValidate", DF, W(LOADED), 0, 0, {"d": COMPLETE}),
    ("DecodeValidate", DF, W(FAILED_LOADED), 0, 0, ("refused", "StickyEnd")),
    ("DecodeCommit", DF, W(FAILED_LOADED._replace(d=COMPLETE)), 0, 0, ("refused", "StickyEnd")),
    ("DecodeStep", DF, W(FAILED_LOADED), 0, 0, ("refused", "StickyEnd")),
    # a failed attempt is given up: all landed, so freed at once, with a Nack
    ("DecodeAbort", DF, W(FAILED_LOADED), 0, 0, {"d": NONE}),
    # one chunk still in flight: fenced and freed (a revocable transport)
    (
        "DecodeAbort",
        DF,
        W(FAILED_LOADED._replace(landed=0b01, net=(msg(M_CHUNK, 1, 1),))),
        0,
        0,
        {"d": NONE, "dfl": DF_FAILED | DF_FENCED, "net": (msg(M_NACK, 1),)},
    ),
    ("DecodeAbort", DF, W(LOADED), 0, 0, ("disabled", None)),  # healthy and running
]


@pytest.mark.parametrize("name,c,w,i,arg,expected", CASES, ids=[c[0] for c in CASES])
def test_guard(name, c, w, i, arg, expected):  # type: ignore[no-untyped-def]
    check_guard(name, c, w, i, arg, expected)


def test_the_mutant_installs_a_failed_attempt_and_sticky_end_flags_it() -> None:
    m = frozenset({"validate_after_decode_failure"})
    w = apply(W(FAILED_LOADED), DF, m, "DecodeValidate", 0, 0)
    assert isinstance(w, World) and w.reqs[0].d == COMPLETE
    assert "StickyEnd" in violated_safety(w, DF)  # the state part
    assert "StickyEnd" in check_step(W(FAILED_LOADED), "DecodeValidate", 0, 0, w, DF)
    w2 = apply(w, DF, m, "DecodeCommit", 0, 0)
    assert isinstance(w2, World) and w2.reqs[0].d == WRITABLE
    assert "StickyEnd" in check_step(w, "DecodeCommit", 0, 0, w2, DF)


def test_a_step_of_a_failed_attempt_breaks_the_transition_part() -> None:
    pre = W(FAILED_LOADED._replace(d=WRITABLE))  # only a buggy engine gets here
    assert "StickyEnd" in check_step(pre, "DecodeStep", 0, 0, pre, DF)
    ok = W(LOADED._replace(d=WRITABLE))
    assert check_step(ok, "DecodeStep", 0, 0, ok, DF) == []


def test_a_new_attempt_starts_clean() -> None:
    """The failure is per attempt: the next Handoff's reservation clears it."""
    h2 = msg(M_HANDOFF, 2)
    r = FAILED_LOADED._replace(d=NONE, landed=0, rmask=0, ep=2, ps=AWAIT_READY, net=(h2,))
    w = apply(W(r), DF, frozenset(), "DecodeReserve", 0, h2)
    assert isinstance(w, World) and not w.reqs[0].dfl & DF_FAILED
    assert not isinstance(apply(w, DF, frozenset(), "DecodeFail", 0, 0), Refused)


def _log(header: dict[str, object], actions: list[str]) -> str:
    lines = [json.dumps(header)]
    for a in actions:
        args = {"req": 0} if "(" not in a else json.loads(a[a.index("(") + 1 : -1])
        lines.append(json.dumps({"action": a.split("(")[0], "args": args}))
    return "\n".join(lines) + "\n"


_STEPS = [
    "PrefillAdmit",
    "PrefillRun",
    "PrefillFreeze",
    'DecodeReserve({"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})',
    'PrefillRecvReady({"req": 0, "msg": "Ready", "epoch": 1, "idx": 0})',
    "PrefillSendChunk",
    "DecodeFail",
    "DecodeStep",
]


def test_the_header_switches_decode_failure_on_for_any_config() -> None:
    v = check_text(_log({"config": "handoff_two", "decode_failure": True}, _STEPS))
    assert (v.line, v.violated) == (9, "StickyEnd")
    v = check_text(_log({"config": "handoff_two"}, _STEPS))  # off: decode has no such step
    assert v.line == 8 and v.violated == "Unmodelled"
    with pytest.raises(LogError, match="decode_failure"):
        check_text(_log({"config": "handoff_two", "decode_failure": "yes"}, _STEPS))
