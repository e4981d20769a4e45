"""Time across workers (issue #21, item 9): per-worker clocks with a stated skew bound.

A wait is past its deadline when any declared worker's clock has passed the deadline
plus ``clock_skew_s``; a clock that no declared worker owns is bad input, so a fresh
clock name cannot hide a stall; hostile header values are refused naming the line.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from model_checks.conformance import LogError, Monitor, check_text
from model_checks.conformance.events import DEFAULT_SKEW_S


def _e(action: str, t: float, kind: str | None = None, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"req": 0}
    if kind is not None:
        args.update(msg=kind, epoch=1, idx=0)
    return {"action": action, "args": args, "t": t, **kw}


def _now(worker: str, t: float, **kw: Any) -> dict[str, Any]:
    return {"action": "Now", "args": {"worker": worker}, "t": t, **kw}


# Decode reserves r0 at t=0.5 on its clock; the final status is lost; prefill gives up
# (its own wait ends) and decode logs nothing more: its wait can only be judged by the
# other workers' clocks. Binary fractions keep the edge exact.
STALL = [
    _e("PrefillAdmit", 0.0),
    _e("PrefillRun", 0.125),
    _e("PrefillFreeze", 0.25),
    _e("DecodeReserve", 0.5, "Handoff"),
    _e("PrefillRecvReady", 0.625, "Ready"),
    _e("PrefillSendChunk", 0.75),
    _e("DecodeReceiveChunk", 0.875, "Chunk"),
    _e("PrefillSendChunk", 1.0),
    _e("EnvLose", 1.125, "RankDone"),
    _e("PrefillTimeout", 30.0),
]


def _log(*events: dict[str, Any], **head: Any) -> str:
    h = {"config": "handoff_two", "timeout_s": 30, **head}
    return "\n".join([json.dumps(h), *(json.dumps(e) for e in events)])


def test_a_stall_on_decode_is_judged_by_another_workers_clock() -> None:
    v = check_text(_log(*STALL, _now("prefill", 45.0)), open_end=True)
    assert (v.line, v.violated) == (12, "BoundedExit")
    assert "decode has waited on r0 (epoch 1) since line 5" in v.reason
    assert "decode clock t=0.5 at line 5, prefill clock t=45 now" in v.reason
    assert "prefill has waited" not in v.reason  # prefill's own wait ended at line 11
    env = check_text(_log(*STALL, _now("decode", 31.0, clock="d0"), clocks={"d0": "decode"}))
    assert (env.line, env.violated) == (12, "BoundedExit")  # decode's other process


@pytest.mark.parametrize(
    ("skew", "t", "late"),
    [
        (0.25, 30.75, False),  # 0.5 + 30 + 0.25: at the bound, not past it
        (0.25, 30.875, True),
        (0.0, 30.5, False),
        (0.0, 30.625, True),
        (10.0, 40.5, False),
        (10.0, 40.625, True),
    ],
)
def test_the_skew_bound_at_its_edge(skew: float, t: float, late: bool) -> None:
    v = check_text(_log(*STALL, _now("prefill", t), clock_skew_s=skew), open_end=True)
    assert v.conforms is not late
    if late:
        assert (v.line, v.violated) == (12, "BoundedExit")
        assert f"clock_skew_s={skew:g}" in v.reason
    assert v.clock_skew_s == skew and v.timeout_s == 30


def test_the_default_skew_is_stated_in_the_verdict() -> None:
    v = check_text(_log(*STALL), open_end=True)
    assert v.conforms and v.clock_skew_s == DEFAULT_SKEW_S
    edge = 0.5 + 30 + DEFAULT_SKEW_S
    assert check_text(_log(*STALL, _now("prefill", edge)), open_end=True).conforms
    assert not check_text(_log(*STALL, _now("prefill", edge + 0.01)), open_end=True).conforms


def test_the_waiting_workers_own_clock_needs_no_skew() -> None:
    v = check_text(_log(*STALL, _now("decode", 30.625), clock_skew_s=5), open_end=True)
    assert (v.line, v.violated) == (12, "BoundedExit")
    assert "decode clock t=30.625 now: 30.125s > timeout_s=30" in v.reason


def test_a_start_read_on_another_clock_costs_two_skews() -> None:
    """The reservation is assumed (unlogged): decode's wait is first read on prefill's
    clock (line 5), so decode's start is bounded only through one skew, and now another."""
    events = [e for e in STALL if e["action"] != "DecodeReserve"]
    ok = check_text(_log(*events, _now("prefill", 30.0 + 0.625 + 0.5), clock_skew_s=0.25))
    assert ok.conforms, ok.reason
    v = check_text(_log(*events, _now("prefill", 30.0 + 0.625 + 0.625), clock_skew_s=0.25))
    assert (v.line, v.violated) == (11, "BoundedExit")
    assert "decode has waited on r0" in v.reason and "2 x clock_skew_s=0.25" in v.reason


def test_an_undeclared_clock_is_refused() -> None:
    hidden = _now("decode", 45.0, clock="d9")
    declared = {"d0": "decode"}
    with pytest.raises(LogError, match="clock 'd9' is not declared") as ei:
        check_text(_log(*STALL, hidden, clocks=declared))
    assert ei.value.line == 12
    with pytest.raises(LogError, match="'d9' is not declared"):  # a cluster log's proc too
        check_text(_log(*STALL, {**hidden, "proc": "d9"}, clocks=declared))
    # declared, the same line is read, and judges the stall
    v = check_text(_log(*STALL, hidden, clocks={"d9": "decode"}))
    assert (v.line, v.violated, v.clocks) == (12, "BoundedExit", {"d9": "decode"})
    # a header without 'clocks' (the older format): a process clock named on a decode
    # line is one of decode's processes; it cannot hide the stall, which it judges
    v = check_text(_log(*STALL, hidden))
    assert (v.line, v.violated) == (12, "BoundedExit")
    assert "decode/d9 clock t=45 now" in v.reason
    # but an event of no worker (the orchestrator's) names a clock no worker owns
    lose = {**STALL[8], "clock": "x1"}
    with pytest.raises(LogError, match="clock 'x1' is not declared") as ei:
        check_text(_log(*STALL[:8], lose, *STALL[9:]))
    assert ei.value.line == 10
    # and a name first seen on a prefill line is prefill's, not decode's
    with pytest.raises(LogError, match="Now is a decode event, but clock 'd9' is prefill's"):
        check_text(_log(*STALL[:4], {**STALL[4], "clock": "d9"}, hidden))


def test_clocks_seen_apart_are_not_compared_unless_the_skew_is_stated() -> None:
    """Without a stated skew the log promises no synchrony: a pair of clocks seen further
    apart than the default skew is no longer compared, so a clock running ahead cannot
    judge the other's wait; with the skew stated, the same log is refused."""
    ahead = [_e("PrefillAdmit", 100.0), _now("decode", 0.25)]  # prefill ~100 s ahead
    rest = [
        {**e, "t": e["t"] + 100} if e["action"].startswith("Prefill") else e for e in STALL[1:9]
    ]
    v = check_text(_log(*ahead, *rest, _now("prefill", 120.0)), open_end=True)
    assert v.conforms, v.reason  # 120 - 0.5 on two clocks seen apart: not compared
    # the same clock still measures a wait it saw begin: prefill's reading at line 7
    # (t=100.625) came after decode's reservation, so t=131 on it is past the deadline
    v = check_text(_log(*ahead, *rest, _now("prefill", 131.0)), open_end=True)
    assert (v.line, v.violated) == (12, "BoundedExit")
    assert "prefill clock t=100.625 at line 7" in v.reason
    with pytest.raises(LogError, match="further apart than clock_skew_s=0.1"):
        check_text(_log(*ahead, clock_skew_s=0.1))


def test_a_clock_of_another_worker_is_refused() -> None:
    with pytest.raises(LogError, match="DecodeReserve is a decode event, but clock 'p0'") as ei:
        check_text(_log(*STALL[:3], {**STALL[3], "clock": "p0"}, clocks={"p0": "prefill"}))
    assert ei.value.line == 5
    with pytest.raises(LogError, match="is prefill's"):
        check_text(_log(*STALL[:3], {**STALL[3], "clock": "prefill"}))
    # the orchestrator's and the router's events may be stamped by any declared process
    lose = {**STALL[8], "clock": "d0"}
    log = _log(*STALL[:8], lose, *STALL[9:], clocks={"d0": "decode"})
    assert check_text(log, open_end=True).conforms


HOSTILE_HEADERS = {
    "skew negative": ({"clock_skew_s": -1}, "clock_skew_s"),
    "skew a string": ({"clock_skew_s": "0.1"}, "clock_skew_s"),
    "skew a bool": ({"clock_skew_s": True}, "clock_skew_s"),
    "skew huge": ({"clock_skew_s": 1e13}, "clock_skew_s"),
    "skew null": ({"clock_skew_s": None}, "clock_skew_s"),
    "clocks a list": ({"clocks": ["d0"]}, "'clocks' must be"),
    "clocks a string": ({"clocks": "d0"}, "'clocks' must be"),
    "clock of no worker": ({"clocks": {"d0": "gpu"}}, "owned by one of"),
    "clock owner not a string": ({"clocks": {"d0": 1}}, "owned by one of"),
    "clock named empty": ({"clocks": {"": "decode"}}, "process name"),
    "clock named like a worker": ({"clocks": {"decode": "prefill"}}, "process name"),
    "clock name unprintable": ({"clocks": {"d\n0": "decode"}}, "process name"),
    "clock name too long": ({"clocks": {"d" * 65: "decode"}}, "process name"),
    "too many clocks": ({"clocks": {f"d{k}": "decode" for k in range(65)}}, "at most 64"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_HEADERS))
def test_hostile_header_values_are_refused(name: str) -> None:
    head, frag = HOSTILE_HEADERS[name]
    with pytest.raises(LogError) as ei:
        check_text(_log(*STALL, **head))
    assert ei.value.line == 1 and frag in ei.value.msg, ei.value.msg
    assert len(ei.value.msg) <= 200 and "\n" not in ei.value.msg


def test_a_monitors_timeout_judges_like_the_headers() -> None:
    """``Monitor(timeout_s=...)`` is the header's ``timeout_s``: the same deadlines, the
    same time-order check across clocks."""
    m = Monitor("handoff_two", timeout_s=30, open_end=True)
    for e in [*STALL, _now("prefill", 45.0)]:
        v = m.feed(e)
    assert v is not None and (v.line, v.violated) == (11, "BoundedExit")  # no header line
    m = Monitor(timeout_s=30)
    assert m.feed({"config": "handoff_two", "clock_skew_s": 0.1}) is None
    assert m.feed(_e("PrefillAdmit", 40.0)) is None  # prefill's clock at 40
    with pytest.raises(LogError, match="further apart than clock_skew_s=0.1"):
        m.feed(_now("decode", 1.0))
    m = Monitor("handoff_two")  # no timeout: no duration is read, so no time order either
    assert m.feed(_e("PrefillAdmit", 40.0)) is None and m.feed(_now("decode", 1.0)) is None
