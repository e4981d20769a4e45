"""The tour and the Hypothesis machine on the per-rank API (issue #30 items 1 and 4): the
decode-rank worlds (``Config.decode_ranks``: each decode rank installs its own shard, the
request runs only once every rank installed, spec ``DecodeRankInstall`` /
``RankAgreement``) on one ``RankSender`` per prefill rank and one ``RankReceiver`` per
decode rank (``refimpl/testing/on_api/worlds/ranks.py``), with the refinement map after
every step, the refusal probes and the content ghost. Before the ranks were mapped, the
adapter refused every such world ("the API has one Receiver for all decode ranks")."""

from __future__ import annotations

import pytest

from refimpl.testing.harness import Divergence
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.tour import ApiHarness, api_report, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from tests.library.tours.tour_helpers import assert_every_pair, assert_machine_walks, first_lines

# per world: (closed edges, edges covered), (pairs, pairs covered): measured
EDGES = {"handoff_tp1to2": (5718, 5718), "pair_ranks_fail": (4656, 4656)}
PAIRS = {"handoff_tp1to2": (40, 40), "pair_ranks_fail": (41, 41)}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_pair_of_a_decode_rank_world_on_the_rank_api(name: str) -> None:
    assert_every_pair(name, PAIRS[name])


@pytest.mark.nightly
@pytest.mark.parametrize("name", sorted(EDGES))
def test_every_edge_of_a_decode_rank_world_on_the_rank_api(name: str) -> None:
    """handoff_tp1to2: 5718/5718 edges, 2,569 walks, 0 divergences (45 CPU s);
    pair_ranks_fail: 4656/4656, 1,758 walks (30 CPU s). Prefill TP 2:
    test_api_tour_ranks_faults.py."""
    plan = plan_api(get_world(name))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES[name], rep
    assert not res.failures, first_lines(res)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_hypothesis_machine_walks_the_decode_ranks(name: str) -> None:
    assert_machine_walks(name)


def test_the_tour_kills_a_decode_rank_sent_another_ranks_heads() -> None:
    """``heads_of_another_rank``: both ends check and seal the same wrong slice, so only
    the bytes catch it: the first layer a rank reports ready holds its neighbour's heads."""
    plan = plan_api_pairs(get_world("handoff_tp1to2"))
    res = run_api_tour(ApiAdapter(), plan, frozenset({"heads_of_another_rank"}))
    kinds = api_report(plan, res)["divergences"]
    assert kinds == {"bytes differ at DecodeReceiveChunk": 4}, kinds
    assert "(decode rank 1) layer 0 ready, not its heads" in str(res.failures[0][1])


# the corrupt copy reaches decode rank 0 alone, after every seal: rank 1 commits its part
LAST_CHUNK_CORRUPT = [
    ("PrefillAdmit", {"req": 0}),
    ("PrefillRun", {"req": 0}),
    ("PrefillFreeze", {"req": 0}),
    ("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0}),
    ("PrefillRecvReady", {"req": 0, "msg": "Ready", "epoch": 1, "idx": 0}),
    ("EnvCorrupt", {"req": 0, "msg": "Chunk", "epoch": 1, "idx": 0}),
    ("DecodeReceiveDone", {"req": 0, "msg": "RankDone", "epoch": 1, "idx": 0}),
    ("DecodeReceiveChunk", {"req": 0, "msg": "ChunkCorrupt", "epoch": 1, "idx": 0}),
]


def _walk(mutants: frozenset[str]) -> ApiHarness:
    h = ApiHarness(ApiAdapter(), get_world("pair_ranks_fail"), mutants)
    h.check_state()
    for name, args in LAST_CHUNK_CORRUPT:
        h.step(name, args)
        h.check_state()
    return h


def test_a_rank_that_committed_before_its_siblings_abort_gives_it_back() -> None:
    """Decode rank 0's chunk fails its checksum while rank 1's lands whole: rank 1 has
    committed its part, then hears rank 0's abort and gives its blocks back; prefill
    sees one Nack (the ranks' verdict of the step), as the spec's one decode worker."""
    h = _walk(frozenset())
    sub = h.impl
    assert [r.state("r0").value for r in sub.rxs] == ["aborted", "aborted"]  # type: ignore[attr-defined]
    assert sub.held_blocks()["D"] == 0


def test_the_walk_kills_a_rank_ready_on_its_own_install() -> None:
    """``ready_on_own_install`` (the spec's decode_runs_before_all_ranks): rank 1 takes
    the request as ready with its own heads; rank 0 has none. The refinement map reads
    both ranks' Receivers and refuses to call that one decode state."""
    with pytest.raises(Divergence, match="decode ranks' d differ"):
        _walk(frozenset({"ready_on_own_install"}))


def test_decode_rank_worlds_the_api_maps_and_those_it_refuses_naming_why() -> None:
    from dataclasses import replace

    assert unexpressed(get_world("handoff_tp1to2")) == []
    assert unexpressed(get_world("pair_ranks_fail")) == []
    c = replace(get_world("handoff_tp1to2"), fault_kinds=frozenset({"crash"}), restarts=1)
    assert unexpressed(c) == []  # restarts: test_api_tour_ranks_restart.py
    c = replace(get_world("handoff_tp1to2"), layers=2, max_attempts=1)
    assert unexpressed(c) == []  # streamed: test_api_tour_ranks_stream.py
    assert "decode_ranks" in unexpressed(get_world("handoff_tp1to2"), remote=True)
    with pytest.raises(ValueError, match="not mapped with decode ranks"):
        ApiAdapter().build(get_world("handoff_tp1to2"), frozenset({"stream_reads_at_ready"}), 0)
    with pytest.raises(ValueError, match="a world with decode ranks"):
        ApiAdapter().build(get_world("mismatch_one"), frozenset({"ready_on_own_install"}), 0)


@pytest.mark.nightly
def test_the_edge_tour_of_pair_ranks_fail_kills_a_rank_ready_on_its_own_install() -> None:
    """2 of 1,758 walks: the last chunk corrupt on decode rank 0 alone, with rank 1
    polled first (it commits and stays ready); handoff_tp1to2's edge tour does not kill
    it (a loss takes every rank's copy, the ranks never part): 0 of 2,569."""
    plan = plan_api(get_world("pair_ranks_fail"))
    res = run_api_tour(ApiAdapter(), plan, frozenset({"ready_on_own_install"}))
    assert api_report(plan, res)["divergences"] == {"crashed at DecodeReceiveChunk": 2}
    assert all("decode ranks' d differ" in str(e) for _, e in res.failures)


def test_kvown_fuzz_refuses_the_decode_ranks_across_processes() -> None:
    from kvown_cli.main import main

    argv = ["fuzz", "--tour", "--impl", "api", "--config", "handoff_tp1to2"]
    assert main([*argv, "--across-processes"]) == 2


def test_a_decode_ranks_failed_load_ends_every_rank_of_both_sides_with_its_reason() -> None:
    """``RankReceiver.fail`` (the engine's load of that rank's part failed, mid-transfer):
    every rank of both sides ends at once with decode rank 1's reason, 0 blocks held."""
    from refimpl import State
    from tests.library.ownership.test_api_ranks import RID, Group

    g = Group(2, 2)
    g.run(upto=1)  # layer 0 of 3 sent: every decode rank is receiving
    assert all(rx.state(RID) is State.RECEIVING for rx in g.rx)
    g.rx[1].fail(RID, "its load failed")
    g.poll()
    for x in [*g.tx, *g.rx]:
        assert x.state(RID) is State.ABORTED, (x, x.reasons(RID))
        assert any("failed on decode: its load failed" in r for r in x.reasons(RID))
    assert g.leftover() == [] and not any(rx.held() for rx in g.rx)


def test_a_request_the_scheduler_ended_is_never_ready_on_any_rank() -> None:
    """``RankReceiver.end`` on every rank before the transfer: no rank commits, the
    prefill ranks end with the refusal, 0 blocks held."""
    from refimpl import State
    from tests.library.ownership.test_api_ranks import RID, Group

    g = Group(2, 2)
    for rx in g.rx:
        rx.end(RID, "the client cancelled")
    g.run()
    assert not any(rx.ready(RID) for rx in g.rx)
    assert all(tx.state(RID) in (State.ABORTED, State.REFUSED) for tx in g.tx)
    assert g.leftover() == [] and not any(rx.held() for rx in g.rx)
