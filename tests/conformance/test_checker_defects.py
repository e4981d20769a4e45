"""Two checker defects of issue #32 (item 3), each at its cause.

(a) A write decode's fence already failed, reported later by the engine as a failed
    write (``DecodeReceiveChunk`` of a ``ChunkCorrupt``), is that failure: it lands
    nothing and conforms. A good ``Chunk`` after the fence is a write that landed.
(b) An ``Unmodelled`` verdict whose explanation assumed a delivery waits for a line that
    bears on it (a ``Now`` does not): when that line logs the delivery, the line is
    judged without the assumption.
"""

from __future__ import annotations

import json
from pathlib import Path

from model_checks.conformance import Monitor, check_text

TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"


def _log(config: str, *events: tuple[str, dict[str, object]] | dict[str, object]) -> str:
    out = [json.dumps({"format": "kvown-eventlog", "version": 1, "config": config})]
    for ev in events:
        obj = ev if isinstance(ev, dict) else {"action": ev[0], "args": ev[1]}
        out.append(json.dumps(obj))
    return "\n".join(out) + "\n"


def _msg(kind: str, idx: int = 0, epoch: int = 1) -> dict[str, object]:
    return {"req": 0, "msg": kind, "epoch": epoch, "idx": idx}


R0 = {"req": 0}
HANDOFF = [
    ("PrefillAdmit", R0),
    ("PrefillRun", R0),
    ("PrefillFreeze", R0),
    ("DecodeReserve", _msg("Handoff")),
    ("PrefillRecvReady", _msg("Ready")),
    ("PrefillSendChunk", R0),
    ("PrefillSendChunk", R0),
]


def test_failed_write_after_the_fence_conforms() -> None:
    v = check_text((TRACES / "ok_failed_write_after_fence.jsonl").read_text())
    assert v.conforms, v.reason


def test_good_chunk_after_the_fence_still_lands_in_freed_blocks() -> None:
    text = _log(
        "handoff_decode_fail",
        *HANDOFF,
        ("DecodeReceiveChunk", _msg("ChunkCorrupt", 0)),
        ("DecodeAbort", R0),
        ("DecodeReceiveChunk", _msg("Chunk", 1)),
    )
    v = check_text(text)
    assert (v.line, v.violated) == (11, "NoReuseUnderIO"), v.reason


def test_reuse_under_an_unfenced_write_is_still_flagged_at_its_line() -> None:
    """A cancel quarantines (no fence): blocks freed while its write is in flight are
    reuse under IO at the free's line, and a failed write reported later hides nothing."""
    freed = {"action": "DecodeAbort", "args": R0, "observed": {"d": "none"}}
    text = _log(
        "handoff_decode_fail",
        *HANDOFF,
        ("ClientCancel", R0),
        freed,
        ("DecodeReceiveChunk", _msg("ChunkCorrupt", 1)),
    )
    v = check_text(text)
    assert (v.line, v.violated) == (10, "NoReuseUnderIO"), v.reason


def test_failed_write_of_an_unfenced_attempt_is_not_a_stutter() -> None:
    """Before any fence a reported failed write is the chunk's own (corrupted) delivery."""
    text = _log(
        "handoff_decode_fail",
        *HANDOFF,
        ("DecodeReceiveChunk", _msg("ChunkCorrupt", 1)),
        ("DecodeReceiveChunk", _msg("ChunkCorrupt", 1)),
    )
    v = check_text(text)
    assert not v.conforms and v.line == 10, v.reason


_REFUTED = [
    ("PrefillAdmit", R0),
    ("PrefillRun", R0),
    ("PrefillFreeze", R0),
    ("DecodeReserve", _msg("Handoff")),
    ("PrefillSendChunk", R0),
    ("ClientCancel", R0),
    {
        "action": "PrefillQuiesce",
        "args": R0,
        "observed": {"p": "none", "d": "quarantined"},
    },
]


def test_unmodelled_on_an_assumed_delivery_is_refuted_by_the_next_line() -> None:
    text = _log("handoff_tp2to1", *_REFUTED, ("DecodeReceiveChunk", _msg("Chunk")))
    v = check_text(text)
    assert (v.line, v.violated, v.refuted_by) == (8, "NoReuseUnderIO", 9), v.reason
    m = Monitor()  # the online monitor gives it one line later, the same verdict
    got = [m.feed_line(raw) for raw in text.splitlines()]
    assert got[-2] is None and got[-1] is not None and got[-1].to_json() == v.to_json()


def test_unmodelled_stays_when_the_next_line_refutes_nothing() -> None:
    for tail in ([("DecodeAbort", R0)], []):
        v = check_text(_log("handoff_tp2to1", *_REFUTED, *tail))
        assert (v.line, v.violated, v.refuted_by) == (8, "Unmodelled", None), v.reason


_NOW = {"action": "Now", "args": {"worker": "prefill"}, "t": 1.0}


def test_unmodelled_stays_open_across_lines_that_decide_nothing() -> None:
    """A ``Now`` line (nothing acts) between the Unmodelled line and the line that logs
    the assumed delivery neither refutes nor confirms the assumption: the verdict stays
    open until the delivery's line refutes it (issue #32: it stopped at the ``Now``)."""
    text = _log("handoff_tp2to1", *_REFUTED, _NOW, ("DecodeReceiveChunk", _msg("Chunk")))
    v = check_text(text)
    assert (v.line, v.violated, v.refuted_by) == (8, "NoReuseUnderIO", 10), v.reason
    m = Monitor()
    got = [m.feed_line(raw) for raw in text.splitlines()]
    assert got[-3:-1] == [None, None] and got[-1] is not None
    assert got[-1].to_json() == v.to_json()


def test_unmodelled_open_across_a_now_stands_at_the_end_of_the_log() -> None:
    v = check_text(_log("handoff_tp2to1", *_REFUTED, _NOW))
    assert (v.line, v.violated, v.refuted_by) == (8, "Unmodelled", None), v.reason
