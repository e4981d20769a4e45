"""Decode ranks with faults on the API tour (issue #30 items 1 and 4): prefill TP 2 ->
decode TP 2 (``ranks_tp2_one``: a corrupt chunk; ``ranks_faults_one``: a crash of a
worker, every rank of its side, or a mismatched manifest) on one ``RankSender`` per
prefill rank and one ``RankReceiver`` per decode rank, with the refinement map after
every step and the drain (every rank's blocks given back) after every walk. Before,
the adapter refused prefill TP > 1, crash and mismatch with decode ranks by name."""

from __future__ import annotations

from typing import Any

import pytest

from refimpl import State
from refimpl.testing.drain import drain
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.tour import (
    ApiHarness,
    api_report,
    close,
    declined,
    plan_api,
    run_api_tour,
)
from refimpl.testing.worlds import get_world
from spec.state import WRITABLE
from tests.library.tours.tour_helpers import assert_every_pair, assert_machine_walks, first_lines

EDGES = {"ranks_tp2_one": (1863, 1863), "ranks_faults_one": (1741, 1741)}
PAIRS = {"ranks_tp2_one": (40, 40), "ranks_faults_one": (41, 41)}
Steps = list[tuple[str, dict[str, Any]]]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_pair_of_a_prefill_tp2_decode_rank_world(name: str) -> None:
    assert unexpressed(get_world(name)) == []
    assert_every_pair(name, PAIRS[name])


@pytest.mark.nightly
@pytest.mark.parametrize("name", sorted(EDGES))
def test_every_edge_of_a_prefill_tp2_decode_rank_world(name: str) -> None:
    """ranks_tp2_one: 1863/1863 edges, 0 divergences (19 CPU s); ranks_faults_one:
    1741/1741 (13 CPU s)."""
    plan = plan_api(get_world(name))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES[name], rep
    assert not res.failures, first_lines(res)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_hypothesis_machine_walks_prefill_tp2_decode_ranks(name: str) -> None:
    assert_machine_walks(name)


def _h(world: str, steps: Steps) -> ApiHarness:
    h = ApiHarness(ApiAdapter(), get_world(world))
    h.check_state()
    for name, args in steps:
        h.step(name, args)
        h.check_state()
    return h


def _drained(h: ApiHarness) -> None:
    c = h.c
    drain(h, lambda w: close(w, c), lambda w, n, i, a: declined(w, c, n, i, a))


FROZEN: Steps = [
    ("PrefillAdmit", {"req": 0}),
    ("PrefillRun", {"req": 0}),
    ("PrefillFreeze", {"req": 0}),
]
# decode rank 0 gets prefill rank 0's chunk and seal alone
RANK_ZERO_FIRST: Steps = [
    *FROZEN,
    ("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0}),
    ("PrefillRecvReady", {"req": 0, "msg": "Ready", "epoch": 1, "idx": 0}),
    ("DecodeReceiveChunk", {"req": 0, "msg": "Chunk", "epoch": 1, "idx": 0}),
    ("DecodeReceiveDone", {"req": 0, "msg": "RankDone", "epoch": 1, "idx": 0}),
]


def test_a_decode_rank_whose_prefill_rank_finished_first_commits_and_waits() -> None:
    """Decode rank 0 holds all of its heads (prefill rank 0's) and commits its part;
    decode rank 1 still waits for prefill rank 1's chunk: the request is not ready on
    any rank, rank 0's ack waits for its sibling's (no spec Ack in flight), and the
    refinement map reads the spec's FILLING (chunk (0, 0) and seal 0 landed)."""
    sub: Any = _h("ranks_tp2_one", RANK_ZERO_FIRST).impl
    assert [r.rx.state(f"r0@{d}") for d, r in enumerate(sub.rxs)] == [
        State.DONE,
        State.RECEIVING,
    ]
    assert not any(r.ready("r0") for r in sub.rxs)
    assert sub.net.held and not any(lm.group[0] == "verdict" for lm in sub.net.flight)
    r = sub.abstract().reqs[0]
    assert (r.landed, r.rmask, r.dmask) == (0b01, 0b01, 0)


def test_prefill_rank_ones_corrupt_chunk_ends_every_rank_with_no_block_held() -> None:
    """Then prefill rank 1's chunk arrives corrupt at decode rank 1: rank 1 nacks, rank 0
    gives back the part it committed, both prefill ranks end on the one Nack (rank 0's
    held ack and rank 1's nack, the decode worker's verdict): no decode block held, no
    copy on prefill; the request keeps its own prefill blocks (the spec's Nack)."""
    sub: Any = _h(
        "ranks_tp2_one",
        [
            *RANK_ZERO_FIRST,
            ("EnvCorrupt", {"req": 0, "msg": "Chunk", "epoch": 1, "idx": 1}),
            ("DecodeReceiveChunk", {"req": 0, "msg": "ChunkCorrupt", "epoch": 1, "idx": 1}),
            ("PrefillResume", {"req": 0, "msg": "Nack", "epoch": 1, "idx": 0}),
        ],
    ).impl
    assert [r.state("r0").value for r in sub.rxs] == ["aborted", "aborted"]
    assert [s.state("r0").value for s in sub.ptx] == ["aborted", "aborted"]
    assert sub.held_blocks()["D"] == 0 and not any(s.held() for s in sub.ptx)
    assert sub.abstract().reqs[0].p == WRITABLE  # the request's own blocks: the scheduler's


def test_a_mismatched_manifest_is_refused_by_every_decode_rank() -> None:
    """A peer of another model: every sub-handoff's manifest names it; each decode rank
    refuses its own at intake, naming the model, and reserves nothing; both prefill
    ranks end on the Nack."""
    h = _h(
        "ranks_faults_one",
        [
            *FROZEN,
            ("EnvManifestMismatch", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0}),
            ("DecodeReject", {"req": 0, "msg": "HandoffBadManifest", "epoch": 1, "idx": 0}),
            ("PrefillResume", {"req": 0, "msg": "Nack", "epoch": 1, "idx": 0}),
        ],
    )
    sub: Any = h.impl
    for d, r in enumerate(sub.rxs):
        assert r.rx.state(f"r0@{d}") in (State.REFUSED, State.ABORTED), d
        assert "model" in str(r.rx.error(f"r0@{d}")), r.rx.error(f"r0@{d}")
    assert all(s.state("r0").final for s in sub.ptx)
    assert sub.held_blocks()["D"] == 0
    _drained(h)


@pytest.mark.parametrize("worker", ["prefill", "decode"])
def test_a_crash_while_one_decode_rank_committed_its_part_leaves_no_block(worker: str) -> None:
    """Prefill or decode crashes, every rank of it, while decode rank 0
    has committed its part and rank 1 still receives: the ranks left end the attempt
    (the router's fate told, their timers) and the drain leaves no block on any rank."""
    h = _h("ranks_faults_one", [*RANK_ZERO_FIRST, ("EnvCrash", {"worker": worker})])
    sub: Any = h.impl
    gone = sub.pp if worker == "prefill" else sub.dps
    assert all(p.alloc.capacity == p.alloc.num_free for p in gone)
    _drained(h)
    assert sub.held_blocks() == {"P": 0, "D": 0}
    live = sub.rxs if worker == "prefill" else sub.ptx
    assert all(x.state("r0").final for x in live)


def test_a_cancel_heard_first_by_the_rank_that_committed_reaches_prefill_as_the_nack() -> None:
    """The scheduler's cancel reaches decode rank 0 first, which has committed its part
    (rank 1 still waits for prefill rank 1's seal): rank 0 gives its blocks back and
    tells every rank; its abort to the prefill ranks travels with rank 1's nack, the
    decode worker's one Nack of the step (the edge tour found it delivered at once,
    before any spec message: prefill ended with no Nack in flight)."""
    h = _h(
        "ranks_faults_one",
        [
            *RANK_ZERO_FIRST,
            ("DecodeReceiveChunk", {"req": 0, "msg": "Chunk", "epoch": 1, "idx": 1}),
            ("ClientCancel", {"req": 0}),
            ("DecodeAbort", {"req": 0}),
        ],
    )
    sub: Any = h.impl
    assert [s.state("r0") for s in sub.ptx] == [State.SENDING, State.SENDING]
    assert sub.held_blocks()["D"] == 0
    _drained(h)
    assert [s.state("r0").value for s in sub.ptx] == ["aborted", "aborted"]
