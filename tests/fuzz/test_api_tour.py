"""The graph tour on the public API (issue #30): real Senders/Receiver, every edge of the
spec closed under the API's eager steps (the small worlds, and a TP 2 one) or every
reachable (action, outcome) pair (the large handoff worlds, ``on_api/pairs.py``), the
refinement map after every step, the probes the API can judge, the content ghost, the
Receiver's layers and the drain."""

from __future__ import annotations

import pytest

from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.gaps import GAPS
from refimpl.testing.on_api.pairs import api_refusals, first_api_pairs, plan_api_pairs
from refimpl.testing.on_api.tour import (
    EAGER,
    api_report,
    close,
    closed_graph,
    plan_api,
    run_api_tour,
)
from refimpl.testing.worlds import get_world
from tests.library.tours.tour_helpers import assert_machine_walks

# per world: (closed edges, edges covered): measured, every edge covered
PINNED = {
    "mismatch_one": (352, 352),
    "net_one": (2102, 2102),
    "crash_both": (1073, 1073),
    "handoff_crash": (7696, 7696),
    "handoff_decode_fail": (7504, 7504),  # Receiver.fail (DecodeFail): 54 CPU s
}


def test_no_divergence_class_is_left_named_but_the_streamed_layer_chunks() -> None:
    """Every gap the tour on the API found in the handoff worlds is closed (issue #30): a
    new one is a failure of the tour tests below, not an entry here. Left: the streamed
    world's two (the API's chunk is one layer, the spec's every layer of a block), which
    tests/behaviours/test_stream.py pins as the only divergences of stream_one. The shared
    host cache's early read of bad bytes is closed: the spec's load reads the copy at each
    HostLoadCopy (tests/library/tours/test_api_tour_host_cache.py)."""
    assert set(GAPS) == {
        "state differs at PrefillRecvReady (net)",
        "state differs at PrefillSendLayer (net)",
    }


def test_the_closed_graph_has_no_eager_step_left_and_its_walks_take_every_edge() -> None:
    c = get_world("mismatch_one")
    g = closed_graph(c)
    for w in g.states:
        assert close(w, c) == w
    for e in range(g.n_edges):  # an eager step is never a step of its own
        assert g.lab[e][0] not in EAGER[:4]
        assert g.dst[e] < g.n_states
    plan = plan_api(c)
    assert plan.states == g.n_states and len(plan.edge_keys) == PINNED["mismatch_one"][0]
    assert plan.spec_edges > len(plan.edge_keys)  # the steps inside a call are not toured


@pytest.mark.parametrize(
    "name",
    [
        "mismatch_one",
        "crash_both",
        pytest.param("net_one", marks=pytest.mark.nightly),
        pytest.param("handoff_crash", marks=pytest.mark.nightly),
        pytest.param("handoff_decode_fail", marks=pytest.mark.nightly),
    ],
)
def test_the_api_tour_covers_every_edge_with_no_divergence(name: str) -> None:
    plan = plan_api(get_world(name))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == PINNED[name], rep
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]
    assert res.probes > 0 and rep["sequences"] == len(plan.sequences)


def _layer_bug() -> frozenset[str]:
    """The layer_ready_on_staging switch (issue #30 bug 1) where the API has it; before
    its fix (an API without switches) the bug is the API's own code."""
    try:
        from refimpl.api.switches import LAYER_READY_ON_STAGING
    except ImportError:
        return frozenset()
    return frozenset({LAYER_READY_ON_STAGING})


def test_the_tour_kills_a_layer_reported_ready_while_only_in_staging() -> None:
    """NoPartialUse at a block-size change (2 -> 4): a layer the Receiver says is ready
    must be in the blocks held() names. The tour's Receiver-layer check sees the bug
    as soon as a layer is complete in staging (6 steps)."""
    plan = plan_api(get_world("mismatch_one"))
    res = run_api_tour(ApiAdapter(dst_block=4), plan, _layer_bug())
    caught = [e for _, e in res.failures if e.kind == "bytes differ"]
    assert caught, api_report(plan, res)["divergences"]
    assert "ready, not in its blocks" in str(caught[0])
    assert min(len(e.program) for e in caught) == 6


def test_the_correct_api_lands_every_ready_layer_in_its_blocks() -> None:
    pytest.importorskip("refimpl.api.switches")  # the fixed API (issue #30 bug 1)
    plan = plan_api(get_world("mismatch_one"))
    res = run_api_tour(ApiAdapter(dst_block=4), plan)
    assert not [e for _, e in res.failures if e.kind in ("bytes differ", "ghost differs")]


def test_a_world_the_api_cannot_run_is_refused_naming_why() -> None:
    c = get_world("async_handoff")  # recompute runs (tests/library/tours/..._recompute.py)
    assert unexpressed(c) == ["async_steps"]
    with pytest.raises(ValueError, match="async_steps: dispatched/completed model steps"):
        ApiAdapter().build(c, frozenset(), 0)
    assert unexpressed(get_world("restart_handoff")) == []  # restarts: on_api/worlds/restarts.py


def test_kvown_fuzz_tour_impl_api_reports_coverage_and_gaps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from kvown_cli.main import main

    assert main(["fuzz", "--tour", "--impl", "api", "--config", "mismatch_one", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    [row] = got["configs"]
    assert got["impl"] == "api" and got["complete"]
    assert (row["edges"], row["edges_covered"]) == PINNED["mismatch_one"]
    assert row["divergences"] == {}
    assert main(["fuzz", "--impl", "api"]) == 2  # the tour only
    assert main(["fuzz", "--tour", "--impl", "api", "--config", "async_handoff"]) == 2
    assert main(["fuzz", "--tour", "--impl", "nope"]) == 2


def test_the_hypothesis_machine_walks_the_api_with_faults() -> None:
    """Random walks with faults on real Senders/Receiver (``on_api.machine``): no
    divergence at all (no gap is named); the walks take steps."""
    assert_machine_walks("mismatch_one")


# per world: (reachable pairs, pairs covered): measured, every pair covered
PAIRS = {
    "stream_one": (42, 42),
    "handoff_tp2to1": (43, 43),
    "handoff_two": (40, 40),
    "faults2_handoff": (42, 42),
    "reject_dup": (39, 39),
    "handoff_decode_fail": (41, 41),  # its edges nightly (PINNED); its pairs by default
}


def test_a_tp2_world_is_toured_edge_by_edge_with_every_rank_a_sender() -> None:
    """Prefill TP 2: each rank's Sender aborts and tells its sibling (issue #30 bug 3);
    the receiver sees the ranks' aborts of one step as the spec's one Quiesced. Before
    the transport grouped them so, 955 of 1,007 walks diverged at the abort."""
    plan = plan_api(get_world("tp2_one"))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == (2376, 2376), rep
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]


def test_the_pair_plan_takes_each_pair_at_its_shallowest_closed_state() -> None:
    c = get_world("stream_one")
    g = closed_graph(c)
    found = first_api_pairs(g)
    for (name, outcome), (sid, e) in found.items():
        if outcome == "ok":
            assert e is not None and g.src[e] == sid and g.lab[e][0] == name
        else:
            assert e is None
            assert (name, outcome.split(":", 1)[-1] if ":" in outcome else None) in {
                (n, p) for n, _, _, p in api_refusals(g.states[sid], c)
            }
        for earlier in range(sid):  # no shallower state (BFS order) offers the pair
            w = g.states[earlier]
            if outcome == "ok":
                assert all(g.lab[x][0] != name for x in g.out_edges(earlier))
            else:
                assert all(
                    n != name or f"refused:{p}" != outcome for n, _, _, p in api_refusals(w, c)
                )
    plan = plan_api_pairs(c)
    assert plan.goal == "pairs" and plan.pairs == frozenset(found)
    assert len(plan.sequences) < len(found)  # a path that is a prefix of another is dropped


@pytest.mark.parametrize(
    "name",
    [  # stream_one's pairs: the CLI's tour below (and across processes, test_api_tour_dist)
        "handoff_decode_fail",
        pytest.param("handoff_tp2to1", marks=pytest.mark.nightly),
        pytest.param("handoff_two", marks=pytest.mark.nightly),
        pytest.param("faults2_handoff", marks=pytest.mark.nightly),
        pytest.param("reject_dup", marks=pytest.mark.nightly),
    ],
)
def test_the_api_tour_covers_every_pair_of_a_large_world(name: str) -> None:
    plan = plan_api_pairs(get_world(name))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["pairs"], rep["pairs_covered"]) == PAIRS[name], rep["pairs_missed"]
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]
    assert res.probes > 0


def test_kvown_fuzz_tour_impl_api_tours_a_large_world_by_pairs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from kvown_cli.main import main

    assert main(["fuzz", "--tour", "--impl", "api", "--config", "stream_one", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    [row] = got["configs"]
    assert got["complete"] and row["goal"] == "pairs"
    assert (row["pairs"], row["pairs_covered"]) == PAIRS["stream_one"]
    assert row["pairs_missed"] == [] and row["divergences"] == {}


def test_restart_handoff_tours_every_pair_on_the_api() -> None:
    """Restarts (EnvRestart, on_api/worlds/restarts.py): 41/41 pairs, no divergence (0.4 CPU s)."""
    plan = plan_api_pairs(get_world("restart_handoff"))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["pairs"], rep["pairs_covered"]) == (41, 41), rep["pairs_missed"]
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]


@pytest.mark.nightly
def test_restart_handoff_every_edge_and_the_stale_incarnation_switch_is_killed() -> None:
    """1404/1404 edges, no divergence (8.3 CPU s); with stale_incarnation_accepted on
    both ends 36 of 631 walks diverge, at PrefillDiscard and DecodeDiscard."""
    plan = plan_api(get_world("restart_handoff"))
    res = run_api_tour(ApiAdapter(), plan)
    assert (len(plan.edge_keys), len(plan.edge_keys & (res.coverage.edges or set()))) == (
        1404,
        1404,
    )
    assert not res.failures
    bad = run_api_tour(ApiAdapter(), plan, frozenset({"stale_incarnation_accepted"}))
    ats = {e.program[-1]["action"] for _, e in bad.failures}
    assert len(bad.failures) == 36 and ats == {"PrefillDiscard", "DecodeDiscard"}
