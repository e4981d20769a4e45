"""Every verdict names a property (or Unmodelled); assumed deliveries are hypotheses a
later line can refute; clocks are per worker; the end of the log is checked."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from model_checks.conformance import UNMODELLED, LogError, check_text
from model_checks.conformance.corpus import edits
from spec.properties import PROPERTIES

TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"
OK = sorted(p.name for p in TRACES.glob("*.jsonl") if not p.name.startswith(("bug_", "incident")))


@pytest.mark.parametrize("name", OK)
def test_no_verdict_lacks_a_property(name: str) -> None:
    lines = (TRACES / name).read_text().splitlines()
    seen: Counter[str] = Counter()
    for what, text in edits(lines):
        try:
            v = check_text("\n".join(text))
        except LogError as exc:  # a swap of timed lines can turn a clock back, or apart
            assert "clock goes backwards" in exc.msg or "clock_skew_s" in exc.msg, (what, exc.msg)
            continue
        if v.conforms:
            continue
        assert v.violated is not None and v.properties and v.properties[0] == v.violated, what
        assert all(p in PROPERTIES or p == UNMODELLED for p in v.properties), (what, v.properties)
        assert v.line is not None and v.event is not None, what
        seen[v.violated] += 1
    assert seen, f"{name}: no mutation of the log was caught"


def _log(config: str, *events: dict[str, Any], **head: Any) -> str:
    return "\n".join([json.dumps({"config": config, **head}), *(json.dumps(e) for e in events)])


def _s(action: str, req: int = 0, **kw: Any) -> dict[str, Any]:
    return {"action": action, "args": {"req": req}, **kw}


def _m(action: str, kind: str, epoch: int = 1, idx: int = 0, **kw: Any) -> dict[str, Any]:
    return {"action": action, "args": {"req": 0, "msg": kind, "epoch": epoch, "idx": idx}, **kw}


START = [_s("PrefillAdmit"), _s("PrefillRun"), _s("PrefillFreeze"), _m("DecodeReserve", "Handoff")]


def test_several_properties_most_specific_first() -> None:
    # the source is freed with no Ack while its own write is still in flight
    events = [*START, _m("PrefillRecvReady", "Ready"), _s("PrefillSendChunk")]
    v = check_text(_log("handoff_two", *events, _m("PrefillRelease", "Ack")))
    assert (v.line, v.properties) == (8, ["NoReuseUnderIO", "NothingLost"])


def test_a_refuted_assumption_moves_the_verdict_back() -> None:
    events = [*START, _s("PrefillSendChunk"), _s("ClientCancel"), _s("PrefillQuiesce")]
    assert check_text(_log("handoff_tp2to1", *events)).conforms  # explainable so far
    late = _m("DecodeReceiveChunk", "Chunk")
    v = check_text(_log("handoff_tp2to1", *events, late))
    assert (v.line, v.violated, v.refuted_by) == (8, "NoReuseUnderIO", 9)
    tried = [(s["before_line"], s["action"]) for s in v.assumed]
    assert (8, "DecodeReceiveChunk") in tried  # the explanation that was refuted
    # the delivery logged before the free: no refutation, it conforms
    events = [*START, _s("PrefillSendChunk"), _s("ClientCancel"), late, _s("PrefillQuiesce")]
    assert check_text(_log("handoff_tp2to1", *events)).conforms


def _timed(prefill_skew: float) -> str:
    """incident 7's shape with prefill's clock shifted by ``prefill_skew`` seconds, and a
    header that states that skew bound."""
    raw = (TRACES / "incident7_sglang_31800.jsonl").read_text().splitlines()
    out = [json.dumps({**json.loads(raw[0]), "clock_skew_s": max(prefill_skew, 0.1)})]
    for line in raw[1:]:
        e = json.loads(line)
        if e["action"].startswith("Prefill"):
            e["t"] += prefill_skew
        out.append(json.dumps(e))
    return "\n".join(out)


@pytest.mark.parametrize("skew", [0.0, 25.0, 5.0])
def test_clocks_are_compared_per_worker(skew: float) -> None:
    v = check_text(_timed(skew))
    assert (v.line, v.violated) == (15, "BoundedExit")  # decode's own clock: 30.1 s


def test_clocks_further_apart_than_the_stated_skew_are_bad_input() -> None:
    raw = _timed(25.0).splitlines()
    head = json.loads(raw[0])
    head["clock_skew_s"] = 0.1  # stated: prefill runs 25 s ahead, further than promised
    with pytest.raises(LogError, match="clock_skew_s=0.1") as ei:
        check_text("\n".join([json.dumps(head), *raw[1:]]))
    assert ei.value.line == 5  # decode's first reading, 24.9 s behind prefill's
    # no skew stated: the log is read; prefill's and decode's clocks, seen apart, are not
    # compared, and decode's own clock gives the same verdict as in sync
    del head["clock_skew_s"]
    v = check_text("\n".join([json.dumps(head), *raw[1:]]))
    assert (v.line, v.violated) == (15, "BoundedExit")


def test_now_marks_time_and_the_end_is_checked() -> None:
    events = [*START, _m("PrefillRecvReady", "Ready"), _s("PrefillSendChunk")]
    timed = [{**e, "t": 0.1 * k} for k, e in enumerate(events)]
    tick = {"action": "Now", "args": {"worker": "decode"}}
    ok = check_text(_log("handoff_two", *timed, {**tick, "t": 20}, timeout_s=30))
    assert ok.conforms  # a write in flight, 19.7 s on decode's clock: may still land
    v = check_text(_log("handoff_two", *timed, {**tick, "t": 31}, timeout_s=30))
    assert (v.line, v.violated) == (8, "BoundedExit")
    # prefill's clock times prefill's own wait (its sender), and decode's past the skew
    ptick = {"action": "Now", "args": {"worker": "prefill"}, "t": 99}
    v = check_text(_log("handoff_two", *timed, ptick, timeout_s=30))
    assert (v.line, v.violated) == (8, "BoundedExit")
    assert "prefill has waited on r0" in v.reason and "decode has waited on r0" in v.reason


def test_a_silent_stall_is_caught_at_the_last_line() -> None:
    events = [*START, _m("PrefillRecvReady", "Ready"), _s("PrefillSendChunk")]
    lost = _m("EnvLose", "Chunk")
    v = check_text(_log("handoff_two", *events, lost))
    assert (v.line, v.violated) == (8, "NoDeadlock")
    assert check_text(_log("handoff_two", *events, lost), open_end=True).conforms
    # nothing lost: the chunk may still land, so the end is not a stall
    assert check_text(_log("handoff_two", *events)).conforms


def _ev(action: str) -> str:
    return json.dumps({"action": action, "args": {"req": 0}}) + "\n"


# A step out of the protocol's order, named by the law the order protects; the same step
# where no law is at stake is Unmodelled (the spec has no word for it), never a guess.
OUT_OF_ORDER = {
    # ... and, the step taken, the request is prefilled with its KV in no block it holds
    # (the spec's PrefillRun effect, derived: st becomes RUNNING): NothingLost second
    "prefill computes before it allocated": (["PrefillRun"], ["NoReuseUnderIO", "NothingLost"]),
    "prefill decodes before it allocated": (["PrefillDecodeStep"], ["NoReuseUnderIO"]),
    "decode writes blocks it never reserved": (
        ["PrefillAdmit", "PrefillRun", "DecodeStep"],
        ["NoReuseUnderIO"],
    ),
    "prefill runs twice": (["PrefillAdmit", "PrefillRun", "PrefillRun"], [UNMODELLED]),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_ORDER))
def test_a_step_out_of_order_is_named_by_the_law_it_breaks(case: str) -> None:
    actions, props = OUT_OF_ORDER[case]
    v = check_text('{"config": "handoff_two", "version": 1}\n' + "".join(map(_ev, actions)))
    assert not v.conforms and v.line == len(actions) + 1
    assert v.properties == props
