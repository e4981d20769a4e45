"""Both behaviours the spec allows where a decode gives up or refuses (issue #30), judged
on engine logs: an ended request's attempt quarantined until the writer quiesces
(``DecodeAbort``) or, on a revocable transport, fenced and freed at once
(``DecodeAbortFenced``); an incompatible manifest reserved and refused at validation, or
refused at intake (``DecodeReject``). Freeing with neither a fence nor a quarantine stays
the bug (vllm #32255), and a fence on a transport with no revoke is refused."""

from __future__ import annotations

from model_checks.conformance import check_text
from tests.conformance.test_checker_defects import HANDOFF, R0, TRACES, _log, _msg

SENT = [*HANDOFF, ("DecodeReceiveChunk", _msg("Chunk", 0)), ("ClientCancel", R0)]


def test_the_quarantine_log_still_conforms() -> None:
    v = check_text((TRACES / "ok_cancel_mid_transfer.jsonl").read_text())
    assert v.conforms, v.reason


def test_a_fenced_abort_frees_at_once_and_its_late_failed_write_conforms() -> None:
    text = _log(
        "handoff_decode_fail",
        *SENT,
        {"action": "DecodeAbortFenced", "args": R0, "observed": {"d": "none"}},
        ("DecodeReceiveChunk", _msg("ChunkCorrupt", 1)),  # the fenced write's late report
        ("PrefillQuiesce", R0),
    )
    v = check_text(text)
    assert v.conforms, v.reason


def test_a_free_with_neither_fence_nor_quarantine_is_still_the_bug() -> None:
    text = _log(
        "handoff_decode_fail",
        *SENT,
        {"action": "DecodeAbort", "args": R0, "observed": {"d": "none"}},
    )
    v = check_text(text)
    assert (v.line, v.violated) == (11, "NoReuseUnderIO"), v.reason


def test_a_fence_on_a_transport_with_no_revoke_is_refused() -> None:
    text = _log("handoff_unrevocable", *SENT, ("DecodeAbortFenced", R0))
    v = check_text(text)
    assert not v.conforms and v.line == 11, v.reason


def test_an_incompatible_manifest_is_refused_at_intake_or_at_validation() -> None:
    start = [("PrefillAdmit", R0), ("PrefillRun", R0), ("PrefillFreeze", R0)]
    rejected = _log(
        "handoff_tp2to1",
        *start,
        {"action": "DecodeReject", "args": _msg("HandoffBadManifest"), "observed": {"d": "none"}},
        ("PrefillResume", _msg("Nack")),
    )
    reserved = _log(
        "handoff_tp2to1",
        *start,
        ("DecodeReserve", _msg("HandoffBadManifest")),
        ("DecodeAbort", R0),
        ("PrefillResume", _msg("Nack")),
    )
    for text in (rejected, reserved):
        v = check_text(text)
        assert v.conforms, v.reason
