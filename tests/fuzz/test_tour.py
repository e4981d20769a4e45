"""The graph tour (``refimpl.testing.tour``, issue #27): its plans cover the graph, the
correct engine conforms on every sequence, and the tour takes every action and presses
every property of the spec, deterministically (the coverage pin of the suite)."""

from __future__ import annotations

import pytest

from model_checks.explicit.trace import replay
from refimpl.testing import Coverage, EngineAdapter
from refimpl.testing.coverage import NONTRIVIAL, edge_key
from refimpl.testing.tour import TourPlan, TourResult, plan_tour, report, run_tour
from refimpl.testing.worlds import get_world
from spec.actions import ACTIONS, decode_args

ADAPTER = EngineAdapter()
# The suite's pair tours: small worlds that together take every action and press every
# property (the tiny tour worlds stand in for the large default configs that reach a
# mismatched manifest, a duplicate or corrupt chunk, a retract and a decode failure);
# each scans its first ``SCAN`` states for (action, outcome) pairs.
COVERAGE_TOURS = (
    "mismatch_one",
    "net_one",
    "retract_fail_one",
    "async_handoff",
    "crash_both",
    "offload_contend",
    "restart_handoff",
    "identity_prefix",
    "handoff_tp1to2",
    "turns_append",
    "host_cache_warm",
    "host_cache_store",
    "stream_one",  # streamed offers (spec/stream): the four layer actions
    "window_prune",  # sliding-window pruning (spec/window): PrefillPruneWindow
)
SCAN = 800


def _walked(plan_name: str, goal: str) -> tuple[set[object], set[object]]:
    """(edge keys the plan's sequences take, the graph's edge keys), on the spec alone."""
    c = get_world(plan_name)
    plan = plan_tour(c, goal)
    taken: set[object] = set()
    for seq in plan.sequences:
        worlds = replay(c, frozenset(), seq)
        for w, st in zip(worlds, seq, strict=False):
            i, arg = decode_args(st["action"], st["args"])
            taken.add(edge_key(w, st["action"], i, arg))
    return taken, set(plan.edge_keys)


def test_the_edge_tour_plan_takes_every_edge_of_the_graph() -> None:
    taken, keys = _walked("offload_contend", "edges")
    assert taken == keys
    plan = plan_tour(get_world("offload_contend"), "edges")
    assert plan.edges == len(keys) == 1626 and max(len(s) for s in plan.sequences) <= 60


@pytest.mark.nightly  # about 12 and 60 CPU s, on the spec alone
@pytest.mark.parametrize("name", ["offload_crash", "handoff_crash"])
def test_the_edge_tour_plan_takes_every_edge(name: str) -> None:
    taken, keys = _walked(name, "edges")
    assert taken == keys


def test_the_engine_conforms_on_every_edge_of_offload_contend() -> None:
    plan = plan_tour(get_world("offload_contend"))
    assert plan.goal == "edges"
    res = run_tour(ADAPTER, plan)
    assert res.failure is None, str(res.failure)
    rep = report(plan, res.coverage)
    assert rep["edges_covered"] == rep["edges"] == 1626
    assert rep["pairs_covered"] == rep["pairs"] and rep["pairs_missed"] == []


def test_a_bounded_tour_of_offload_crash_conforms_and_covers_what_it_walked() -> None:
    """The bounded sibling of the nightly full tour: the first 150 sequences."""
    plan = plan_tour(get_world("offload_crash"))
    res = run_tour(ADAPTER, plan, limit=150)
    assert res.failure is None, str(res.failure)
    assert res.sequences == 150
    assert res.coverage.edges is not None
    assert len(plan.edge_keys & res.coverage.edges) >= 400


@pytest.mark.nightly  # the full tours: about 40 and 150 CPU s
@pytest.mark.parametrize("name", ["offload_crash", "handoff_crash"])
def test_the_engine_conforms_on_every_edge(name: str) -> None:
    plan = plan_tour(get_world(name))
    res = run_tour(ADAPTER, plan)
    assert res.failure is None, str(res.failure)
    rep = report(plan, res.coverage)
    assert rep["edges_covered"] == rep["edges"] and rep["pairs_missed"] == []


# The tests of the pair tours run on one xdist worker: the module fixture is run once.
PAIR_TOURS = pytest.mark.xdist_group("tests/fuzz/test_tour.py::pair_tours")


@pytest.fixture(scope="module")
def pair_tours() -> dict[str, tuple[TourPlan, TourResult]]:
    """Every pair tour of ``COVERAGE_TOURS``, run once for the tests below."""
    out = {}
    for name in COVERAGE_TOURS:
        plan = plan_tour(get_world(name), "pairs", scan=SCAN)
        out[name] = (plan, run_tour(ADAPTER, plan))
    return out


@PAIR_TOURS
@pytest.mark.parametrize("name", COVERAGE_TOURS)
def test_the_engine_conforms_on_every_reachable_pair(
    name: str, pair_tours: dict[str, tuple[TourPlan, TourResult]]
) -> None:
    plan, res = pair_tours[name]
    assert res.failure is None, str(res.failure)
    assert report(plan, res.coverage)["pairs_missed"] == []


@PAIR_TOURS
def test_the_tours_take_every_action_and_press_every_property(
    pair_tours: dict[str, tuple[TourPlan, TourResult]],
) -> None:
    """The coverage pin, held by the tour (no exception list): every spec action is
    accepted on the engine and every safety property is checked on a state where it has
    something to say."""
    suite = Coverage(edges=set())
    for _, res in pair_tours.values():
        suite.merge(res.coverage)
    assert [a for a in ACTIONS if not suite.accepted[a]] == []
    assert [p for p in NONTRIVIAL if not suite.properties[p]] == []


def test_kvown_fuzz_tour_prints_the_coverage_report(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kvown_cli.main import main

    assert main(["fuzz", "--tour", "--config", "mismatch_one", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    [row] = got["configs"]
    assert got["complete"] and got["failure"] is None
    assert row["config"] == "mismatch_one" and row["goal"] == "pairs"
    assert row["pairs_covered"] == row["pairs"] > 50 and row["steps"] > 0


def test_kvown_fuzz_tour_misuse_exits_2() -> None:
    from kvown_cli.main import main

    assert main(["fuzz", "--tour", "--mutant", "cancel_ignored"]) == 2
    assert main(["fuzz", "--tour", "--config", "nope", "--json"]) == 2
