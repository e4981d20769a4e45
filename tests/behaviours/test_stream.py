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
    M_CHUNK,
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
PL = CONFIGS["pair_prefix_layers"]  # 1 block, a 1-block prefix, 1 layer
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
    # a whole prefix hit lands no chunk: its layers are in the prefix blocks (pair_prefix_layers)
    ("DecodeInstallLayer", PL, W(LANDED._replace(d=RESERVED, landed=0, hit=1)), 0, 0, {"inl": 1}),
    ("DecodeInstallLayer", ST, W(LANDED._replace(d=RESERVED, landed=0)), 0, 0, ("disabled", None)),
]

PROPERTY_CASES = [  # (property, config, a state that breaks it, one that does not)
    ("NoReuseUnderIO", ST, W(FROZEN._replace(lay=2, cpy=1, fs=1)), W(GIVEN._replace(fs=1))),
    ("NoPartialUse", ST, W(LANDED._replace(rdy=1)), W(LANDED._replace(inl=1, rdy=1))),
    (  # a chunk in flight before every layer was given (PrefillSendChunk's guard)
        "FrozenSnapshot",
        ST,
        W(FROZEN._replace(ps=SENDING, dep=1, d=RESERVED, net=(msg(M_CHUNK, 1, 0),))),
        W(FROZEN._replace(ps=SENDING, dep=1, d=RESERVED, lay=2, cpy=2, net=(msg(M_CHUNK, 1, 0),))),
    ),
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


def test_the_tour_on_the_api_refuses_a_streamed_world_of_other_layers_naming_why() -> None:
    from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed

    assert unexpressed(ST) == [] and unexpressed(CONFIGS["stream_reuse"]) == ["layers"]
    with pytest.raises(ValueError, match="layers: a streamed world"):
        ApiAdapter().build(CONFIGS["stream_reuse"], frozenset(), 0)


# the tour on the public API (refimpl/testing/on_api/worlds/streamed.py): measured
STREAM_FOUND = {  # the correct API's divergence classes in stream_one, each in on_api.gaps:
    # only the layer chunks since the handoff worlds' gaps were closed (Receiver.end etc.)
    "state differs at PrefillRecvReady (net)",
    "state differs at PrefillSendLayer (net)",
}


def _tour(dst_block: int, mutants: frozenset[str]) -> tuple[dict[str, object], list[object]]:
    from refimpl.testing.on_api.adapter import ApiAdapter
    from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour

    plan = plan_api(ST)
    res = run_api_tour(ApiAdapter(dst_block=dst_block), plan, mutants)
    return api_report(plan, res), [e for _, e in res.failures]


def test_the_api_tours_a_streamed_world_and_finds_only_the_named_gaps() -> None:
    from refimpl.testing.on_api.gaps import GAPS
    from refimpl.testing.on_api.tour import gap_of

    rep, failures = _tour(2, frozenset())
    assert (rep["edges"], rep["edges_covered"]) == (1719, 1694), rep
    found = {gap_of(e) for e in failures}  # type: ignore[arg-type]
    assert found <= set(GAPS) and found == STREAM_FOUND, sorted(found)


def test_the_api_tour_kills_a_stream_that_reads_its_blocks_at_ready() -> None:
    """Issue #30 bug 2: the Sender takes no copy at send_layer; the refinement map reads
    its copies (``Stream.copied``): caught at the first send_layer (4 steps)."""
    from refimpl.api.switches import STREAM_READS_AT_READY
    from refimpl.testing.on_api.tour import gap_of

    _, failures = _tour(2, frozenset({STREAM_READS_AT_READY}))
    caught = [e for e in failures if gap_of(e) == "state differs at PrefillSendLayer (cpy)"]  # type: ignore[arg-type]
    assert caught and min(len(e.program) for e in caught) == 4  # type: ignore[attr-defined]


def test_the_api_tour_kills_a_layer_reported_ready_from_staging() -> None:
    """Issue #30 bug 1 at a block-size change (2 -> 4): the Receiver leaves the layer in
    staging; the blocks the engine reads do not have it (8 steps)."""
    from refimpl.api.switches import LAYER_READY_ON_STAGING
    from refimpl.testing.on_api.tour import gap_of

    rep, failures = _tour(4, frozenset())
    assert not [e for e in failures if gap_of(e) not in STREAM_FOUND], rep  # type: ignore[arg-type]
    _, failures = _tour(4, frozenset({LAYER_READY_ON_STAGING}))
    caught = [e for e in failures if gap_of(e) == "state differs at DecodeReceiveChunk (inl)"]  # type: ignore[arg-type]
    assert caught and min(len(e.program) for e in caught) == 8  # type: ignore[attr-defined]


def test_the_correct_engine_refines_every_edge_of_the_streamed_world() -> None:
    """The engine's streamed offers (refimpl/engine/behaviours/stream.py): every edge of
    stream_one, with the refinement map, the probes and the bytes after every step."""
    from refimpl.testing import EngineAdapter
    from refimpl.testing.tour import plan_tour, report, run_tour

    plan = plan_tour(ST, goal="edges")
    res = run_tour(EngineAdapter(), plan)
    assert res.failure is None, str(res.failure)
    rep = report(plan, res.coverage)
    assert (rep["edges"], rep["edges_covered"]) == (3411, 3411)  # every edge (pinned)
