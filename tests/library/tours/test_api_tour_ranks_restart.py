"""Decode ranks with a restart on the API tour (issue #30 item 4): ``ranks_restart_one``
(decode TP 2 with decode ranks; a worker, every rank of its side, crashes once and
comes back as a new incarnation) on one ``RankSender`` per prefill rank and one
``RankReceiver`` per decode rank: ``EnvRestart`` builds every rank of that side anew,
``RankSender/RankReceiver(incarnation=k)``, and tells every rank of the other side
(``peer_restarted``); the refinement map reads the ranks' incarnations, ``rinc`` and
``dep`` across the restart (``on_api/worlds/ranks.py``, ``rank_map.py``). Before, the
adapter refused decode ranks with restarts by name."""

from __future__ import annotations

import pytest

from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from tests.library.tours.tour_helpers import (
    assert_every_pair,
    assert_machine_walks,
    first_lines,
    walks_to,
)

WORLD = "ranks_restart_one"
EDGES, PAIRS = (1404, 1404), (41, 41)  # measured: closed edges, pairs (covered)
SWITCH = "rank_accepts_dead_incarnation"
DISCARD_KILLS = 24  # measured: of the 209 walks cut at their first DecodeDiscard


def test_every_pair_of_decode_ranks_with_a_restart() -> None:
    assert unexpressed(get_world(WORLD)) == []
    assert_every_pair(WORLD, PAIRS)


def test_the_hypothesis_machine_walks_decode_ranks_with_a_restart() -> None:
    assert_machine_walks(WORLD)


@pytest.mark.nightly
def test_every_edge_of_decode_ranks_with_a_restart() -> None:
    """1404/1404 edges, 631 walks, 0 divergences (7 CPU s)."""
    plan = plan_api(get_world(WORLD))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES, rep
    assert not res.failures, first_lines(res)


def test_the_tour_kills_a_decode_rank_that_takes_a_dead_prefill_incarnations_message() -> None:
    """``rank_accepts_dead_incarnation``: after prefill's restart, a manifest, seal or
    abort its dead incarnation left on the wire is taken by the decode ranks as
    current. The spec fences it (``DecodeDiscard``: nothing changes); the map reads the
    ranks' Receivers reserving (``d``, ``dep``), nacking (``net``) or taking the seal
    (``rmask``). The edge walks cut at their first ``DecodeDiscard``; every one of them
    that discards a dead incarnation's message diverges there."""
    plan = walks_to(plan_api(get_world(WORLD)), "DecodeDiscard")
    clean = run_api_tour(ApiAdapter(), plan)
    assert not clean.failures, first_lines(clean)
    res = run_api_tour(ApiAdapter(), plan, frozenset({SWITCH}))
    kinds = api_report(plan, res)["divergences"]
    assert kinds and all(k.startswith("state differs at DecodeDiscard") for k in kinds), kinds
    assert sum(kinds.values()) == DISCARD_KILLS, kinds
