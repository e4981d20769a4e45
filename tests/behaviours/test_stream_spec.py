"""Streamed offers (spec/stream/layers.py): guards, the properties, the mutants.

Rows in the shape of ``tests/spec/test_guards_decode.py`` (which counts them in its
every-action-has-both-cases check) and of ``tests/spec/test_spec_properties.py``.
"""

from __future__ import annotations

import pytest

from spec.actions import apply
from spec.common import Refused, used_p
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import (
    AWAIT_READY,
    COMPLETE,
    FAILED,
    FILLING,
    M_HANDOFF,
    M_NACK,
    NONE,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
    msg,
)
from tests.spec.spec_helpers import R, W, check_guard

ST = CONFIGS["stream_one"]  # 1 block, 2 layers, one attempt
HO = CONFIGS["handoff_tp2to1"]  # no layers
FROZEN = R(st=RUNNING, p=COMPLETE, ep=1, ps=AWAIT_READY, net=(msg(M_HANDOFF, 1),))
GIVEN = FROZEN._replace(lay=2, cpy=2)  # every layer given and copied
LANDED = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=FILLING, landed=1, ps=SENDING, sent=1)

CASES = [
    ("PrefillSendLayer", ST, W(FROZEN), 0, 0, {"lay": 1, "cpy": 1}),
    ("PrefillSendLayer", ST, W(GIVEN), 0, 0, ("disabled", None)),  # every layer given
    ("PrefillSendLayer", HO, W(FROZEN), 0, 0, ("disabled", None)),  # no layers here
    ("PrefillSendLayer", ST, W(R(st=RUNNING, p=WRITABLE)), 0, 0, ("disabled", None)),
    ("PrefillFreeSource", ST, W(GIVEN), 0, 0, {"fs": 1, "p": COMPLETE}),
    ("PrefillFreeSource", ST, W(FROZEN._replace(lay=1, cpy=1)), 0, 0, ("disabled", None)),
    ("PrefillFreeSource", ST, W(GIVEN._replace(fs=1)), 0, 0, ("disabled", None)),
    ("PrefillFreeSource", HO, W(GIVEN), 0, 0, ("disabled", None)),
    ("DecodeInstallLayer", ST, W(LANDED), 0, 0, {"inl": 1}),
    ("DecodeInstallLayer", ST, W(LANDED._replace(inl=2)), 0, 0, ("disabled", None)),
    ("DecodeInstallLayer", ST, W(LANDED._replace(landed=0)), 0, 0, ("disabled", None)),
    ("DecodeInstallLayer", HO, W(LANDED), 0, 0, ("disabled", None)),
    ("DecodeLayerReady", ST, W(LANDED._replace(inl=1)), 0, 0, {"rdy": 1}),
    ("DecodeLayerReady", ST, W(LANDED), 0, 0, ("refused", "NoPartialUse")),  # staging only
    ("DecodeLayerReady", ST, W(LANDED._replace(d=RESERVED, landed=0)), 0, 0, ("disabled", None)),
    ("DecodeLayerReady", HO, W(LANDED._replace(inl=1)), 0, 0, ("disabled", None)),
]

PROPERTY_CASES = [  # (property, config, a state that breaks it, one that does not)
    ("NoReuseUnderIO", ST, W(FROZEN._replace(lay=2, cpy=1, fs=1)), W(GIVEN._replace(fs=1))),
    ("NoPartialUse", ST, W(LANDED._replace(rdy=1)), W(LANDED._replace(inl=1, rdy=1))),
]


@pytest.mark.parametrize("row", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_guard(row) -> None:  # type: ignore[no-untyped-def]
    check_guard(*row)


def test_a_chunk_leaves_only_once_every_layer_was_given() -> None:
    send = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=RESERVED, ps=SENDING, lay=1, cpy=1)
    assert isinstance(apply(W(send), ST, frozenset(), "PrefillSendChunk", 0, 0), Refused)
    ok = apply(W(send._replace(lay=2, cpy=2)), ST, frozenset(), "PrefillSendChunk", 0, 0)
    assert ok.reqs[0].sent == 1  # type: ignore[union-attr]


def test_a_freed_source_is_not_counted_and_a_nack_fails_the_request_closed() -> None:
    freed = GIVEN._replace(fs=1, ps=SENDING, net=(msg(M_NACK, 1),), dep=1)
    assert used_p(W(freed), ST) == 0 and used_p(W(GIVEN), ST) == 1
    after = apply(W(freed), ST, frozenset(), "PrefillResume", 0, msg(M_NACK, 1))
    r = after.reqs[0]  # type: ignore[union-attr]
    assert (r.st, r.p, r.ps) == (FAILED, NONE, 0)
    assert violated_safety(after, ST) == []  # type: ignore[arg-type]


def test_the_stream_mutants_make_the_bad_states() -> None:
    w = apply(W(FROZEN), ST, frozenset({"stream_reads_at_ready"}), "PrefillSendLayer", 0, 0)
    assert w.reqs[0].lay == 1 and w.reqs[0].cpy == 0  # type: ignore[union-attr]
    w = apply(W(LANDED), ST, frozenset({"layer_ready_on_staging"}), "DecodeLayerReady", 0, 0)
    assert "NoPartialUse" in violated_safety(w, ST)  # type: ignore[arg-type]


def test_the_tour_on_the_api_refuses_a_streamed_world_naming_why() -> None:
    from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed

    assert unexpressed(ST) == ["layers"] and unexpressed(HO) == []
    with pytest.raises(ValueError, match="layers: PrefillSendLayer"):
        ApiAdapter().build(ST, frozenset(), 0)
