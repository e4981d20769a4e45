"""SPEC.md "Crash fates": a decode crash fails the live requests decode owned and a
running one whose only copy was there; a prefill crash fails every live request without
a validated copy on decode. The spec, its z3 encoding (agreement tests) and the
event-log checker read the same rule."""

from __future__ import annotations

from model_checks.conformance import check_text
from spec.actions_env import EnvCrash
from spec.config import CONFIGS
from spec.state import COMPLETE, FAILED, QUEUED, RUNNING, WRITABLE, Req, World

C = CONFIGS["handoff_crash"]


def _crash(r: Req, worker: int) -> Req:
    w = EnvCrash(World(reqs=(r,)), C, frozenset(), 0, worker)
    assert isinstance(w, World)
    return w.reqs[0]


def test_decode_crash_fails_only_what_decode_owned() -> None:
    assert _crash(Req(st=RUNNING, d=WRITABLE), 1).st == FAILED  # committed: its only copy
    assert _crash(Req(st=QUEUED), 1).st == QUEUED  # one fate, admitted or not
    assert _crash(Req(st=RUNNING, p=WRITABLE), 1).st == RUNNING
    assert _crash(Req(st=RUNNING, p=COMPLETE, d=COMPLETE, ep=1, dep=1), 1).st == RUNNING
    assert _crash(Req(st=RUNNING, d=COMPLETE), 1).st == FAILED  # its only copy (NothingLost)


def test_prefill_crash_fails_what_has_no_validated_copy_on_decode() -> None:
    assert _crash(Req(st=QUEUED), 0).st == FAILED
    assert _crash(Req(st=RUNNING, p=WRITABLE), 0).st == FAILED
    assert _crash(Req(st=RUNNING, d=WRITABLE), 0).st == RUNNING


def test_a_queued_request_is_served_after_a_decode_crash() -> None:
    log = [
        '{"config": "handoff_crash"}',
        '{"action": "EnvCrash", "args": {"worker": "decode"}}',
        '{"action": "PrefillAdmit", "args": {"req": 0}}',
        '{"action": "PrefillRun", "args": {"req": 0}}',
        '{"action": "PrefillFinish", "args": {"req": 0}, "observed": {"st": "finished"}}',
    ]
    v = check_text("\n".join(log))
    assert v.conforms, v.reason
