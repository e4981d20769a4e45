"""Offload and reload to a ``DiskTier`` on the API tour (issue #30 item 1): the offload
worlds run with ``ApiAdapter(offload_to="disk")``, each move the shipped
``offload_async``/``reload_async`` ``Transfer`` with its I/O thread stepped through its
stop checks (``on_api/worlds/disk_offload.py``), the refinement map reading the folder
after every step, the refusal probes, the content ghost (the host copy read back through
the tier, every block verified) and the drain. ``offload_restart`` (``offload_crash``
with one restart) adds the crash survival: a copy published when the prefill crashed
is adopted by the restarted tier and reads back whole (``disk_problems``). The suite
runs the pair tours; the edge tours are nightly. The ``failed_store_visible`` switch (a
store's writer that renames although the cancel asked it to stop) is killed at
``EnvStoreFail`` by the map reading the folder and the device pools."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from refimpl.api.switches import FAILED_STORE_VISIBLE
from refimpl.testing.harness import Divergence
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.tour import ApiHarness, api_report, gap_of, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from spec.state import COMPLETE, FAILED, NONE, WRITABLE
from tests.library.tours.tour_helpers import first_lines, walks_to

DISK = ApiAdapter(offload_to="disk")
PAIRS = {"offload_crash": (44, 44), "offload_restart": (45, 45), "offload_contend": (16, 16)}
EDGES = {  # (closed edges, covered), measured: the same as on host pools where both run
    "offload_crash": (2050, 2050),
    "offload_restart": (3856, 3856),
    "offload_contend": (1090, 1090),
}
MOVES = ("PrefillOffloadBegin", "PrefillOffloadCommit", "PrefillReloadBegin", "PrefillReloadCommit")


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_pair_of_an_offload_world_runs_on_a_disk_tier(name: str) -> None:
    assert unexpressed(get_world(name)) == []
    plan = plan_api_pairs(get_world(name))
    assert set(MOVES) <= {st["action"] for seq in plan.sequences for st in seq}
    res = run_api_tour(DISK, plan)
    rep = api_report(plan, res)
    assert (rep["pairs"], rep["pairs_covered"]) == PAIRS[name], rep["pairs_missed"]
    assert not res.failures, first_lines(res)
    assert res.probes > 0


@pytest.mark.nightly
@pytest.mark.parametrize("name", sorted(EDGES))
def test_every_edge_of_an_offload_world_runs_on_a_disk_tier(name: str) -> None:
    plan = plan_api(get_world(name))
    res = run_api_tour(DISK, plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES[name], rep
    assert not res.failures, first_lines(res)


def _walk(world: str, steps: list[tuple[str, dict[str, Any]]], mutants: Any = ()) -> ApiHarness:
    h = ApiHarness(DISK, get_world(world), frozenset(mutants), 0, None)
    h.check_state()
    for name, args in steps:
        h.step(name, args)
        h.check_state()  # the map, every property, integrity, the survival check, the ghost
    return h


R0 = {"req": 0}
STORED = [("PrefillAdmit", R0), ("PrefillRun", R0), ("PrefillOffloadBegin", R0)]
CRASH, RESTART = ("EnvCrash", {"worker": "prefill"}), ("EnvRestart", {"worker": "prefill"})


def _files(h: ApiHarness) -> list[str]:
    return sorted(os.listdir(h.impl.dfolder))  # type: ignore[attr-defined]


def test_a_store_publishes_only_at_its_commit_and_its_copy_reloads_whole() -> None:
    h = _walk("offload_crash", STORED)
    s: Any = h.impl
    assert s.dtier.keys() == [] and len(_files(h)) == 1  # a temp file only, invisible
    h.step("PrefillOffloadCommit", R0)
    h.check_state()
    assert s.dtier.keys() == [s.dkeys[0]] and not s.pp[0].alloc.blocks_of("r0")
    for name in ("PrefillReloadBegin", "PrefillReloadCommit"):
        h.step(name, R0)
        h.check_state()
    assert s.dtier.keys() == [] and h.w.reqs[0].p == WRITABLE and h.w.reqs[0].h == NONE
    kv = s.pp[0].gather(s.pp[0].alloc.blocks_of("r0"))
    assert torch.equal(kv, s.model.content(0, 0))


def test_a_failed_store_publishes_nothing_and_thaws_the_device_copy() -> None:
    h = _walk("offload_contend", [*STORED, ("EnvStoreFail", R0)])
    s: Any = h.impl
    assert _files(h) == [] and h.w.reqs[0].p == WRITABLE  # the temp file removed
    assert s.pinned_by_move(0) == () and len(s.pp[0].alloc.blocks_of("r0")) == 2


def test_a_copy_published_before_a_prefill_crash_is_adopted_by_the_restarted_tier() -> None:
    h = _walk("offload_restart", [*STORED, ("PrefillOffloadCommit", R0), CRASH, RESTART])
    s: Any = h.impl
    assert h.w.reqs[0].st == FAILED and h.w.reqs[0].h == NONE  # the spec: the request's copy
    assert s.dtier.adopted == [s.dkeys[0]]  # the file outlived the process, adopted
    assert s.survivors == {0: s.dkeys[0]} and s.disk_problems() == []
    assert torch.equal(s.read_back(0), s.model.content(0, 0))  # whole, every block verified
    assert s.held_blocks()["H"] == 0  # the cache's copy, no request's: nothing leaks


def test_a_reload_in_flight_at_a_crash_leaves_the_copy_published_for_the_restart() -> None:
    steps = [*STORED, ("PrefillOffloadCommit", R0), ("PrefillReloadBegin", R0), CRASH, RESTART]
    h = _walk("offload_restart", steps)
    s: Any = h.impl
    assert s.dtier.adopted == [s.dkeys[0]] and s.disk_problems() == []


def test_a_store_in_flight_at_a_crash_is_never_published() -> None:
    h = _walk("offload_restart", [*STORED, CRASH, RESTART])
    s: Any = h.impl
    assert s.dtier.keys() == [] and s.dtier.adopted == []  # its temp file is no copy
    assert s.dtier.lookup(s.gp, s.dtokens(0)) == 0


def test_the_survival_check_reads_the_folder() -> None:
    """The check can fail: a survivor's file removed behind the restarted tier's back."""
    h = _walk("offload_restart", [*STORED, ("PrefillOffloadCommit", R0), CRASH, RESTART])
    s: Any = h.impl
    s.dtier.path(s.dkeys[0]).unlink()
    assert s.disk_problems() == ["r0@disk: its copy did not survive the crash whole"]


def test_the_failed_store_visible_switch_is_killed_at_the_store_failure_by_the_map() -> None:
    """Each walk of offload_contend to its first EnvStoreFail diverges there: the copy is
    published (h) and the device copy freed (p), where the spec thaws it."""
    plan = walks_to(plan_api(get_world("offload_contend")), "EnvStoreFail")
    res = run_api_tour(DISK, plan, frozenset({FAILED_STORE_VISIBLE}))
    assert len(res.failures) == res.sequences == len(plan.sequences) > 0
    gaps = {gap_of(e) for _, e in res.failures}
    assert all(g.startswith("state differs at EnvStoreFail") for g in gaps), gaps
    assert all("h" in g and "p" in g for g in gaps), gaps


def test_the_same_walk_without_the_switch_holds() -> None:
    h = _walk("offload_contend", [*STORED, ("EnvStoreFail", R0)])
    assert h.w.reqs[0].h == NONE and h.w.reqs[0].p == WRITABLE
    with pytest.raises(Divergence):  # and with it, at that step
        _walk("offload_contend", [*STORED, ("EnvStoreFail", R0)], {FAILED_STORE_VISIBLE})


def test_the_map_names_a_published_copy_complete_whatever_the_move_says() -> None:
    h = _walk("offload_contend", STORED, {FAILED_STORE_VISIBLE})
    s: Any = h.impl
    s.dmoves[0][1].cancel()  # the writer renames anyway
    assert s.tier_fields(0)["h"] == COMPLETE and s.dtier.keys() == [s.dkeys[0]]
