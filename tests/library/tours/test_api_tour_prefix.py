"""A decode-side prefix on the API tour (issue #30): the decode engine's prefix cache lent
to the Receiver (``Receiver.expect(prefix=...)``), every prefill rank's offer sending the
blocks after it (``offer(prefix_blocks=)``), the cache's eviction refused while a request
references the blocks (``on_api/worlds/prefix.py``). The refinement map reads the spec's
``hit``, ``phit``, ``pfx`` and ``pfx_ref`` from the ends and the allocator's refcounts
(``refimpl.api.abstract``). Before this, the adapter refused every world with a prefix.

The suite tours ``full_hit_one`` (a zero-block handoff: the whole prompt is the cached
prefix) edge by edge; the spec's prefix worlds (two requests sharing the prefix, partial
hits at prefill TP 2, crashes) are large: their pair tours are nightly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from refimpl.errors import RefcountError
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.report import plan_for
from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour
from refimpl.testing.on_api.worlds.prefix import PREFIX_CACHE
from refimpl.testing.worlds import get_world
from tests.library.tours.tour_helpers import (
    assert_every_pair,
    assert_machine_walks,
    first_lines,
    walks_to,
)

EDGES = {"full_hit_one": (789, 789), "partial_hit_tp2_one": (3757, 3757)}  # measured
# a partial hit (1 of 2 blocks) at prefill TP 2, no fault: the chunks after the prefix,
# each rank's (the spec's chunk index rank * (blocks - hit) + block - hit)
PARTIAL = dataclasses.replace(
    get_world("prefix_partial_tp2"), name="partial_hit_tp2_one", faults=0, fault_kinds=frozenset()
)
# per world: (reachable pairs, pairs covered): measured, every pair covered
PAIRS = {
    "prefix_share": (42, 42),  # 35.7 CPU s (35.5 of them the plan)
    "prefix_partial_tp2": (45, 45),  # 9.1 CPU s
    "prefix_partial_two": (42, 42),  # 47.2 CPU s
    "prefix_crash": (43, 43),  # 47.1 CPU s
    # the combined worlds (refimpl/testing/worlds.py) with a prefix; prefix_faults's
    # closed graph passes the 200,000-state bound of ``closed_graph``: not toured
    "partial_prefix": (46, 46),  # TP 1 -> 2, 1 of 3 blocks a prefix, a net fault: 19.2 CPU s
    "tp_pairs": (44, 44),  # TP 2 -> 4, 1 of 2 a prefix, a corrupt or duplicate chunk: 94.5 s
}


def test_full_hit_one_is_toured_edge_by_edge_on_the_api_with_no_divergence() -> None:
    """789/789 closed edges (3.4 CPU s): the zero-block handoff, the cache's eviction
    (taken, and refused while referenced: the probes), a decode crash losing the cache."""
    c = get_world("full_hit_one")
    assert c.prefix == c.blocks and unexpressed(c) == []
    assert unexpressed(c, remote=True) == ["prefix"]  # the cache is not read remotely yet
    plan = plan_for("full_hit_one")  # what ``kvown fuzz --tour --impl api`` tours
    assert plan.goal == "edges"
    taken = {st["action"] for seq in plan.sequences for st in seq}
    assert {"DecodeEvictPrefix", "DecodeReserve", "DecodeFinish"} <= taken
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES["full_hit_one"], rep
    assert not res.failures, first_lines(res)
    assert res.probes > 0


def test_a_partial_hit_at_prefill_tp2_covers_every_pair_on_the_api() -> None:
    """42/42 pairs, no divergence (1.3 CPU s); its 3757 edges nightly (below)."""
    plan = plan_api_pairs(PARTIAL)
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["pairs"], rep["pairs_covered"]) == (42, 42), rep["pairs_missed"]
    assert not res.failures, first_lines(res)
    assert res.probes > 0


@pytest.mark.nightly
def test_a_partial_hit_at_prefill_tp2_is_toured_edge_by_edge_on_the_api() -> None:
    """3757/3757 closed edges, no divergence (26 CPU s)."""
    plan = plan_api(PARTIAL)
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES["partial_hit_tp2_one"], rep
    assert not res.failures, first_lines(res)


def _subject(name: str = "full_hit_one", mutants: frozenset[str] = frozenset()) -> object:
    s = ApiAdapter().build(get_world(name), mutants, 0)
    for step in ("PrefillAdmit", "PrefillRun", "PrefillFreeze"):
        s.step(step, {"req": 0})  # type: ignore[attr-defined]
    return s


def test_the_receiver_references_the_lent_prefix_until_its_request_frees_it() -> None:
    s: object = _subject()
    [b] = s.pfx_blocks  # type: ignore[attr-defined]
    alloc = s.dp.alloc  # type: ignore[attr-defined]
    assert alloc.refcount(b) == 1 and alloc.holders() == (PREFIX_CACHE,)
    handoff = {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0}
    s.step("DecodeReserve", handoff)  # type: ignore[attr-defined]
    assert alloc.refcount(b) == 2 and alloc.blocks_of("r0") == (b,)  # nothing else reserved
    with pytest.raises(RefcountError):
        s.step("DecodeEvictPrefix", {})  # type: ignore[attr-defined]
    s.step("PrefillRecvReady", {"req": 0, "msg": "Ready", "epoch": 1, "idx": 1})  # type: ignore[attr-defined]
    s.step("DecodeReceiveDone", {"req": 0, "msg": "RankDone", "epoch": 1, "idx": 0})  # type: ignore[attr-defined]
    w = s.abstract()  # type: ignore[attr-defined]
    assert (w.reqs[0].hit, w.reqs[0].phit, w.pfx, w.pfx_ref) == (1, 1, True, 1)
    got = s.rx.result("r0")  # type: ignore[attr-defined]  # committed: the prefix, read-only
    assert got.blocks == (b,)
    want = s.model.content(0, 0)  # type: ignore[attr-defined]
    assert torch.equal(s.dp.gather([b]), want)  # type: ignore[attr-defined]
    s.step("DecodeFinish", {"req": 0})  # type: ignore[attr-defined]
    assert alloc.refcount(b) == 1 and s.abstract().pfx_ref == 0  # type: ignore[attr-defined]
    s.step("DecodeEvictPrefix", {})  # type: ignore[attr-defined]
    assert alloc.num_free == alloc.capacity and not s.abstract().pfx  # type: ignore[attr-defined]


def test_the_tour_kills_a_receiver_that_does_not_reference_the_lent_prefix() -> None:
    """``prefix_unreferenced`` (``refimpl.api.switches``): the Receiver reads the lent
    prefix blocks without its own reference, so the cache may evict and reuse them under
    the request. The refinement map reads the reference count from the allocator: the
    walks cut at their first ``DecodeReserve`` (``walks_to``) diverge there, on
    ``pfx_ref``, where the prefix was still cached; the correct API passes them."""
    plan = walks_to(plan_api(get_world("full_hit_one")), "DecodeReserve")
    res = run_api_tour(ApiAdapter(), plan, frozenset({"prefix_unreferenced"}))
    assert res.failures
    assert {e.program[-1]["action"] for _, e in res.failures} == {"DecodeReserve"}
    first = {str(e).splitlines()[0].split(": ", 1)[-1] for _, e in res.failures}
    assert first == {
        "after DecodeReserve, abstract() is not the spec's state: spec -> impl pfx_ref: 1 -> 0"
    }
    assert not run_api_tour(ApiAdapter(), plan).failures


def test_the_hypothesis_machine_walks_full_hit_one_on_the_api() -> None:
    assert_machine_walks("full_hit_one")


@pytest.mark.nightly
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_prefix_worlds_cover_every_pair_on_the_api(name: str) -> None:
    """Every spec config with a prefix and no feature the API cannot run, and the combined
    worlds with one: every reachable (action, outcome) pair, no divergence (their closed
    graphs are tens of thousands of states: up to a minute and a half of CPU each)."""
    assert unexpressed(get_world(name)) == []
    assert_every_pair(name, PAIRS[name])
