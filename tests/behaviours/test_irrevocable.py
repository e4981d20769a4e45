"""Writes that cannot be taken back (spec/behaviours/irrevocable.py): guards, the
property, the two mutants, and the refimpl's transport flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_checks.conformance import LogError, check_text
from refimpl.engine.wire import Wire
from spec.actions import apply
from spec.config import CONFIGS
from spec.properties import no_reuse_under_io
from spec.state import (
    AWAIT_ACK,
    COMPLETE,
    DF_CORRUPT,
    DF_FENCED,
    FAILED,
    FILLING,
    G_FOREIGN,
    M_CHUNK,
    M_NACK,
    M_QUIESCED,
    NONE,
    QUARANTINED,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
    World,
    msg,
)
from tests.spec.spec_helpers import R, W, check_guard

TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"
UR = CONFIGS["handoff_unrevocable"]  # one request, 2 blocks, src_tp=1, revocable=False
RV = CONFIGS["handoff_decode_fail"]  # the same shape on a revocable transport
C0, C1 = msg(M_CHUNK, 1, 0), msg(M_CHUNK, 1, 1)
POSTED = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=RESERVED, ps=SENDING, sent=1, net=(C0,))
BOTH = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=FILLING, ps=AWAIT_ACK, landed=0b01, net=(C1,))
NACK = msg(M_NACK, 1)
QUAR = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=QUARANTINED, ps=SENDING, sent=1)

CASES = [
    # decode gives up: a revocable transport fences and frees; an unrevocable one cannot
    ("DecodeTimeout", RV, W(POSTED), 0, 0, {"d": NONE, "net": (msg(M_NACK, 1),)}),
    ("DecodeTimeout", UR, W(POSTED), 0, 0, {"d": QUARANTINED, "net": (C0, msg(M_NACK, 1))}),
    # the quarantine ends only once the writer can write no more
    ("DecodeTimeout", UR, W(QUAR), 0, 0, ("disabled", None)),  # still sending
    ("DecodeTimeout", UR, W(QUAR._replace(ps=AWAIT_ACK, net=(C1,))), 0, 0, ("disabled", None)),
    ("DecodeTimeout", UR, W(QUAR._replace(ps=AWAIT_ACK)), 0, 0, {"d": NONE}),
    # everything landed: nothing more can land, so decode frees at once
    ("DecodeTimeout", UR, W(BOTH._replace(landed=0b11, net=())), 0, 0, {"d": NONE}),
    # an invalid attempt of a running request: quarantined, not fenced
    ("DecodeAbort", UR, W(BOTH._replace(dfl=DF_CORRUPT)), 0, 0, {"d": QUARANTINED}),
    ("DecodeAbort", RV, W(BOTH._replace(dfl=DF_CORRUPT)), 0, 0, {"d": NONE, "net": (NACK,)}),
    # a write of a "fenced" attempt still lands, in blocks decode no longer holds
    ("DecodeReceiveChunk", UR, W(POSTED._replace(d=NONE, dfl=DF_FENCED)), 0, C0, {"g": G_FOREIGN}),
    ("DecodeReceiveChunk", RV, W(POSTED._replace(d=NONE, dfl=DF_FENCED)), 0, C0, {"g": 0}),
    # the sender cannot flush: its timeout waits for every task of its batch
    ("PrefillTimeout", UR, W(BOTH), 0, 0, ("refused", "NoReuseUnderIO")),
    ("PrefillTimeout", UR, W(BOTH._replace(net=())), 0, 0, {"st": FAILED, "p": NONE}),
    ("PrefillTimeout", RV, W(BOTH), 0, 0, {"st": FAILED, "net": (msg(M_QUIESCED, 1),)}),
    # on the Nack the sender resumes only with its writes done, and then says Quiesced
    (
        "PrefillResume",
        UR,
        W(BOTH._replace(net=tuple(sorted((C1, NACK))))),
        0,
        NACK,
        ("refused", "FrozenSnapshot"),
    ),
    (
        "PrefillResume",
        UR,
        W(BOTH._replace(d=QUARANTINED, net=(NACK,))),
        0,
        NACK,
        {"p": WRITABLE, "net": (msg(M_QUIESCED, 1),)},
    ),
    ("PrefillResume", RV, W(BOTH._replace(d=NONE, net=(NACK,))), 0, NACK, {"net": ()}),
]


@pytest.mark.parametrize("name,c,w,i,arg,expected", CASES, ids=[c[0] for c in CASES])
def test_guard(name, c, w, i, arg, expected):  # type: ignore[no-untyped-def]
    check_guard(name, c, w, i, arg, expected)


def test_a_fence_counts_for_no_reuse_only_on_a_revocable_transport() -> None:
    fenced = W(POSTED._replace(d=NONE, dfl=DF_FENCED))
    assert no_reuse_under_io(fenced, RV)
    assert not no_reuse_under_io(fenced, UR)


def test_free_fenced_unrevocable_frees_under_the_write() -> None:
    m = frozenset({"free_fenced_unrevocable"})
    w = apply(W(POSTED), UR, m, "DecodeTimeout", 0, 0)
    assert isinstance(w, World) and w.reqs[0].d == NONE and C0 in w.reqs[0].net
    assert not no_reuse_under_io(w, UR)


def test_batch_status_subset_frees_the_source_under_task_1() -> None:
    m = frozenset({"batch_status_subset"})
    w = apply(W(BOTH), UR, m, "PrefillTimeout", 0, 0)  # task 0 done, task 1 in flight
    assert isinstance(w, World) and w.reqs[0].p == NONE and C1 in w.reqs[0].net
    assert not no_reuse_under_io(w, UR)
    assert not isinstance(apply(W(BOTH), UR, frozenset(), "PrefillTimeout", 0, 0), World)


def test_the_wire_takes_nothing_back_when_unrevocable() -> None:
    def chunk(h: dict[str, object]) -> bool:
        return h["kind"] == "Chunk"

    for revocable, left in ((True, 0), (False, 1)):
        wire = Wire(revocable=revocable)
        wire.send("0>d", {"kind": "Chunk", "req": 0, "epoch": 1, "idx": 0}, b"x")
        assert wire.revoke("0>d", chunk) == 1 - left
        assert len(wire.entries("0>d")) == left
        assert wire.drop_where("0>d", chunk) == left  # a crash still fails it


def test_the_header_says_the_transport_is_unrevocable() -> None:
    lines = (TRACES / "bug_late_write_after_timeout.jsonl").read_text().splitlines()
    assert check_text("\n".join(lines)).line == 9  # revocable: the fenced write cannot land
    head = json.loads(lines[0]) | {"transport": "unrevocable"}
    body = [json.loads(x) for x in lines[1:]]
    text = "\n".join(json.dumps(x) for x in [head, *body])
    assert check_text(text).conforms  # decode quarantined: the write lands harmlessly
    body[6]["observed"] = {"d": "none"}  # the engine freed at its timeout
    v = check_text("\n".join(json.dumps(x) for x in [head, *body]))
    assert (v.line, v.violated) == (8, "NoReuseUnderIO")
    with pytest.raises(LogError, match="transport"):
        check_text(json.dumps(head | {"transport": "maybe"}) + "\n" + lines[1])
