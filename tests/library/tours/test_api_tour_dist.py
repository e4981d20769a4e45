"""The tour on the API across processes (issue #30): the Receiver in its own OS process,
the Senders in the tour's, every message over ``DistTransport`` (gloo) between them
while the spec schedules the network (``refimpl/testing/on_api/remote.py``). The
refinement map, every safety property, the content ghost, the Receiver's layers, the
refusal probes and the drain after every step, as in process. The decode process is
ended by its pid."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator

import pytest

from refimpl.testing.on_api.adapter import ApiAdapter
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.remote import RemoteDecode
from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from tests.library.tours.tour_helpers import walks_to_early_ends

pytestmark = pytest.mark.xdist_group("dist-tour")  # one process group per worker at a time


@pytest.fixture(scope="module")
def rd() -> Iterator[RemoteDecode]:
    with RemoteDecode() as r:
        yield r
    assert r.proc.poll() is not None  # the decode process is gone
    with pytest.raises(ProcessLookupError):
        os.kill(r.proc.pid, 0)


def _tour(rd: RemoteDecode, name: str, pairs: bool, **kw: object) -> dict[str, object]:
    c = get_world(name)
    plan = plan_api_pairs(c) if pairs else plan_api(c)
    res = run_api_tour(ApiAdapter(remote=rd, **kw), plan)  # type: ignore[arg-type]
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]
    assert res.probes > 0
    return api_report(plan, res)


def test_kvown_fuzz_tour_impl_api_across_processes(capsys: pytest.CaptureFixture[str]) -> None:
    """First in the file: the command makes its own process group (one per process at a
    time), before the module's decode process below makes the other."""
    from kvown_cli.main import main

    argv = ["fuzz", "--tour", "--impl", "api", "--across-processes", "--config", "stream_one"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["across_processes"] and got["complete"]
    [row] = got["configs"]  # the streamed world across processes: every pair
    assert row["goal"] == "pairs" and (row["pairs"], row["pairs_covered"]) == (42, 42)
    assert row["pairs_missed"] == [] and row["divergences"] == {}
    assert main(["fuzz", "--across-processes"]) == 2  # the engine's tour runs in process


def test_the_tour_across_processes_kills_a_layer_ready_only_in_staging(
    rd: RemoteDecode,
) -> None:
    """Bug 1 (layer_ready_on_staging) in the decode process: a layer reported ready
    that is not in the blocks held() names is caught there too, in 6 steps."""
    plan = plan_api(get_world("mismatch_one"))
    mut = frozenset({"layer_ready_on_staging"})
    res = run_api_tour(ApiAdapter(remote=rd, dst_block=4), plan, mut, limit=40)
    caught = [e for _, e in res.failures if e.kind == "bytes differ"]
    assert caught and "ready, not in its blocks" in str(caught[0])
    assert min(len(e.program) for e in caught) == 6


def test_a_fenced_attempts_writes_in_flight_are_dropped_by_the_decode_transport(
    rd: RemoteDecode,
) -> None:
    """A timeout and a cancel with a chunk still in flight (mismatch_one's walks through
    DecodeTimeout and DecodeAbortFenced): the decode process's DistTransport drops the
    late write on arrival, so it never lands (the spec's fence)."""
    plan = plan_api(get_world("mismatch_one"))

    def fenced_in_flight(seq: list[dict[str, object]]) -> bool:  # a write out, then fenced
        names = [st["action"] for st in seq]
        ready = names.index("PrefillRecvReady") if "PrefillRecvReady" in names else len(names)
        return any(n in ("DecodeTimeout", "DecodeAbortFenced") for n in names[ready + 1 :])

    seqs = [s for s in plan.sequences if fenced_in_flight(s)][:12]
    res = run_api_tour(ApiAdapter(remote=rd), dataclasses.replace(plan, sequences=seqs))
    assert res.sequences == 12 and not res.failures


@pytest.mark.nightly
@pytest.mark.parametrize(
    "name,pairs,want",
    [
        ("handoff_tp2to1", True, (43, 43)),
        ("mismatch_one", False, (352, 352)),
        ("crash_both", False, (1073, 1073)),
    ],
)
def test_the_api_tour_across_processes_covers_its_goal(
    rd: RemoteDecode, name: str, pairs: bool, want: tuple[int, int]
) -> None:
    rep = _tour(rd, name, pairs)
    got = (rep["pairs"], rep["pairs_covered"]) if pairs else (rep["edges"], rep["edges_covered"])
    assert got == want


def test_restart_handoff_across_processes_covers_every_pair(rd: RemoteDecode) -> None:
    """The decode process restarts its Receiver (incarnation 1): 41/41 pairs (1.6 CPU s)."""
    rep = _tour(rd, "restart_handoff", pairs=True)
    assert (rep["pairs"], rep["pairs_covered"]) == (41, 41), rep["pairs_missed"]


def test_the_unrevocable_worlds_nacks_and_timeouts_under_writes_across_processes(
    rd: RemoteDecode,
) -> None:
    """unrevocable_one with the Receiver over ``DistTransport(revocable=False)`` in its own
    process, the edge tour's walks that resume after a Nack or time out, each to its first
    ``PrefillResume`` / ``PrefillTimeout`` (``walks_to_early_ends``; 583 of the 2,133 steps): the
    Nacks the Senders read and the aborts they are given while writes are in flight
    (``on_api.early``; measured: 8 and 89), the quarantine until the Sender's Quiesced.
    Every closed edge across processes (2,133 steps over gloo, minutes): nightly, below."""
    plan = walks_to_early_ends(plan_api(get_world("unrevocable_one")))
    res = run_api_tour(ApiAdapter(remote=rd), plan)
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]
    rep = api_report(plan, res)
    assert res.sequences == 62 and res.probes > 0
    assert rep["early_nacks"] == 8 and rep["early_aborts"] == 89, rep


@pytest.mark.nightly
def test_the_small_unrevocable_world_across_processes_covers_every_edge(rd: RemoteDecode) -> None:
    """unrevocable_one with the Receiver over ``DistTransport(revocable=False)`` in its own
    process: its quarantine until the nacked Sender's Quiesced, the Nacks the Senders
    read and the aborts they are given while writes are in flight (``on_api.early``),
    every closed edge."""
    c = get_world("unrevocable_one")
    plan = plan_api(c)
    res = run_api_tour(ApiAdapter(remote=rd), plan)
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == (581, 581), rep
    assert rep["early_nacks"] == 27 and rep["early_aborts"] == 185 and res.probes > 0
