"""The shared host cache on the API tour (issue #30 item 1): a ``DiskTier`` holding the
prompt's one chunk, its I/O threads stepped through the shipped ``Transfer``'s stop
checks (``refimpl.tiers.transfer.Stepper``), with the refinement map
(``refimpl.api.abstract.host_cache_part``) after every step, the refusal probes and the
content ghost (``on_api/worlds/host_cache.py``). ``host_cache_store`` (a store, its
publish, its abandon, a lookup, a load, an eviction) is toured edge by edge with no
divergence, and ``host_cache_warm`` (a failed load: the copy's bytes damaged on disk, each
read checked as the I/O thread makes it, as the spec's HostLoadCopy) in the nightly
suite."""

from __future__ import annotations

import pytest

from refimpl.api.switches import FAILED_LOAD_KEEPS_HIT
from refimpl.testing.harness import Divergence, Harness
from refimpl.testing.on_api.actions import ApiRefusal
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.gaps import GAPS
from refimpl.testing.on_api.tour import ApiHarness, api_report, gap_of, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from spec.behaviours.host_cache import HK_READ_BAD
from spec.state import COMPLETE, NONE, PREFILLING, QUARANTINED
from tests.library.tours.tour_helpers import first_lines

EDGES = {"host_cache_store": (121, 121), "host_cache_warm": (3801, 3801)}  # measured
FAILED_LOAD = ["HostLookup", "EnvLoadFail", "HostLoadBegin", "HostLoadCopy"]  # it reads bad


def test_host_cache_store_is_toured_edge_by_edge_on_the_api_with_no_divergence() -> None:
    c = get_world("host_cache_store")
    assert unexpressed(c) == []
    plan = plan_api(c)
    taken = {st["action"] for seq in plan.sequences for st in seq}
    assert {"HostStoreBegin", "HostPublish", "HostStoreAbort", "HostLoadCommit"} <= taken
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES["host_cache_store"], rep
    assert not res.failures, first_lines(res)
    assert res.probes > 0


@pytest.mark.nightly
def test_host_cache_warm_is_toured_edge_by_edge_on_the_api_with_no_divergence() -> None:
    plan = plan_api(get_world("host_cache_warm"))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES["host_cache_warm"], rep
    assert not res.failures, first_lines(res)


def _args(name: str) -> dict[str, int]:
    return {} if name == "EnvLoadFail" else {"req": 0}


def _harness(mutants: frozenset[str] = frozenset()) -> Harness:
    h = ApiHarness(ApiAdapter(), get_world("host_cache_warm"), mutants, 0, None)
    h.check_state()
    return h


def test_a_failed_load_is_a_real_checksum_failure_and_unpublishes_the_hit() -> None:
    h = _harness()
    for name in FAILED_LOAD:
        h.step(name, _args(name))
        h.check_state()
    assert h.w.hc_bad and h.impl.abstract().hc_bad  # the bytes on disk fail their checksum
    assert h.w.reqs[0].hk == HK_READ_BAD  # the load's read found it (the map: Prefix.bad)
    h.step("HostLoadFail", {"req": 0})
    h.check_state()
    s = h.impl
    assert s.tier.lookup(s.gp, s.token_ids()) == 0  # type: ignore[attr-defined]  # a miss
    assert not s.pp[0].alloc.blocks_of("r0")  # type: ignore[attr-defined]  # given back
    with pytest.raises(Exception) as exc:  # the next lookup is refused: nothing published
        h.impl.step("HostLookup", {"req": 1})
    assert getattr(exc.value, "prop", None) == "PublishAfterCommit"


def test_the_failed_load_keeps_hit_switch_is_killed_by_the_map() -> None:
    h = _harness(frozenset({FAILED_LOAD_KEEPS_HIT}))
    for name in FAILED_LOAD:
        h.step(name, _args(name))
    with pytest.raises(Divergence) as exc:
        h.step("HostLoadFail", {"req": 0})  # the spec unpublishes; the switch keeps the hit
    assert gap_of(exc.value) == "state differs at HostLoadFail (hc, hc_bad, hc_hl)"
    assert gap_of(exc.value) not in GAPS


def test_a_store_in_flight_is_invisible_and_its_abandon_publishes_nothing() -> None:
    h = ApiHarness(ApiAdapter(), get_world("host_cache_store"), frozenset(), 0, None)
    for name, i in [("PrefillAdmit", 0), ("PrefillRun", 0), ("HostStoreBegin", 0)]:
        h.step(name, {"req": i})
        h.check_state()
    s = h.impl
    assert s.tier.keys() == []  # type: ignore[attr-defined]  # a temp file only
    with pytest.raises(Exception) as exc:
        s.step("HostLookup", {"req": 1})
    assert getattr(exc.value, "prop", None) == "PublishAfterCommit"
    h.step("HostStoreAbort", {"req": 0})
    h.check_state()
    assert s.tier.keys() == [] and not list(s.tier.directory.iterdir())  # type: ignore[attr-defined]


def test_a_load_that_read_every_block_before_the_damage_commits() -> None:
    h = _harness()
    for name in ["HostLookup", "HostLoadBegin", "HostLoadCopy", "HostLoadCopy", "EnvLoadFail"]:
        h.step(name, _args(name))
        h.check_state()
    h.step("HostLoadCommit", {"req": 0})  # the blocks hold verified bytes
    h.check_state()
    assert h.w.reqs[0].st == PREFILLING and h.w.hc == COMPLETE and h.w.hc_bad


def test_a_cancelled_load_that_read_bad_bytes_unpublishes_the_copy() -> None:
    h = _harness()
    for name in [*FAILED_LOAD, "ClientCancel", "PrefillQuiesce"]:
        h.step(name, _args(name))
        h.check_state()
    s = h.impl
    assert h.w.hc in (QUARANTINED, NONE)  # unpublished (freed with its last reader)
    assert s.tier.lookup(s.gp, s.token_ids()) == 0  # type: ignore[attr-defined]  # a miss


def test_a_fail_without_its_read_steps_the_io_thread_to_the_bad_block_then_polls() -> None:
    h = _harness()
    for name in ["HostLookup", "HostLoadBegin", "HostLoadCopy", "EnvLoadFail", "HostLoadFail"]:
        h.step(name, _args(name))  # HostLoadFail: the second block's read fails, then poll
        h.check_state()
    s = h.impl
    assert h.w.hc in (QUARANTINED, NONE) and h.w.reqs[0].p == NONE  # freed: no pin left
    assert s.tier.lookup(s.gp, s.token_ids()) == 0  # type: ignore[attr-defined]  # a miss
    assert not s.pp[0].alloc.blocks_of("r0")  # type: ignore[attr-defined]  # given back


def test_a_load_that_read_every_block_before_the_damage_cannot_fail() -> None:
    h = _harness()
    for name in ["HostLookup", "HostLoadBegin", "HostLoadCopy", "HostLoadCopy", "EnvLoadFail"]:
        h.step(name, _args(name))
    before = h.impl.snapshot()
    with pytest.raises(ApiRefusal):  # the spec: not enabled; nothing is read or settled
        h.impl.step("HostLoadFail", {"req": 0})
    assert h.impl.snapshot() == before
