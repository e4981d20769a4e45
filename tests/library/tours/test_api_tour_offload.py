"""Offload and reload on the API (issue #30 item 1): ``refimpl.api.offload``'s stepwise
moves (``begin_offload``/``begin_reload``, a ``Handoff`` over host pools) toured against
the spec's host replica (h, hl, gl, mv) on ``offload_crash``, every closed edge, with the
refinement map after every step, the refusal probes, the content ghost (the host copy
read back from the host pools) and the drain (host pools included). Before this, the
adapter refused every offload world. The ``release_before_install`` switch (an offload
that frees the device copy before the host committed) is killed by the refinement map:
the device pools' own table says the request holds nothing while the spec's p is
COMPLETE."""

from __future__ import annotations

import pytest
import torch

from refimpl import State, read_kv
from refimpl.api.handoff import Handoff
from refimpl.api.offload import begin_offload, begin_reload, reload
from refimpl.api.switches import RELEASE_BEFORE_INSTALL
from refimpl.errors import ChecksumError
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from tests.library.lib_helpers import Pair, geo, held, pair, prefill
from tests.library.tours.tour_helpers import assert_every_pair, walks_to

EDGES = {"offload_crash": (2050, 2050)}  # (closed edges, edges covered): measured
MOVES = ("PrefillOffloadBegin", "PrefillOffloadCommit", "PrefillReloadBegin", "PrefillReloadCommit")


def test_offload_crash_covers_every_pair_on_the_api_taking_every_offload_step() -> None:
    """The suite's tour of offload_crash: every reachable (action, outcome) pair (44
    walks); every edge (1,049 walks, 2050/2050): nightly, below."""
    assert unexpressed(get_world("offload_crash")) == []
    plan = plan_api_pairs(get_world("offload_crash"))
    assert set(MOVES) <= {st["action"] for seq in plan.sequences for st in seq}
    assert_every_pair("offload_crash", (44, 44))


@pytest.mark.nightly
def test_offload_crash_is_toured_edge_by_edge_on_the_api_with_no_divergence() -> None:
    c = get_world("offload_crash")
    assert unexpressed(c) == []
    plan = plan_api(c)
    taken = {st["action"] for seq in plan.sequences for st in seq}
    assert set(MOVES) <= taken  # the walks take every offload/reload step
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES["offload_crash"], rep
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]
    assert res.probes > 0 and rep["sequences"] == len(plan.sequences)


def test_the_tour_kills_an_offload_that_frees_the_device_copy_before_the_host_commits() -> None:
    """Every walk of the tour that offloads, to its first ``PrefillOffloadBegin``
    (``walks_to``: the walks that never offload cannot meet the switch): each diverges
    there, by the refinement map."""
    plan = walks_to(plan_api(get_world("offload_crash")), "PrefillOffloadBegin")
    res = run_api_tour(ApiAdapter(), plan, frozenset({RELEASE_BEFORE_INSTALL}))
    first = {str(e).splitlines()[0].split(": ", 1)[-1] for _, e in res.failures}
    assert len(res.failures) == res.sequences == len(plan.sequences) > 0
    assert all(e.kind == "state differs" for _, e in res.failures)
    assert {e.program[-1]["action"] for _, e in res.failures} == {"PrefillOffloadBegin"}
    assert any("r0.p: complete -> none" in f for f in first), sorted(first)[:3]


def _offloading(mutants: frozenset[str]) -> tuple[Pair, Handoff, torch.Tensor]:
    p = pair(geo(), geo(), dst_cap=8)  # the destination: host pools
    kv = prefill(p, "r", 10)
    h = begin_offload(
        p.src, geo(), p.dst, geo(), "r", list(range(10)), free_device=True, mutants=mutants
    )
    h.round()  # the host blocks reserved, every chunk sent; nothing committed yet
    return p, h, kv


@pytest.mark.parametrize("mutant", [False, True])
def test_an_offload_keeps_the_device_copy_until_the_host_committed(mutant: bool) -> None:
    p, h, kv = _offloading(frozenset({RELEASE_BEFORE_INSTALL}) if mutant else frozenset())
    assert h.receiver.state("r") is State.RECEIVING
    assert bool(p.src.alloc.blocks_of("r")) is not mutant
    h.run()
    back = read_kv(p.dst, p.dst.alloc.blocks_of("r"), 10)
    assert torch.equal(back, kv)  # the switch: the bytes had left, the ownership not
    assert not p.src.alloc.blocks_of("r")


def test_a_failed_store_thaws_the_device_copy_and_leaves_no_host_block() -> None:
    p, h, kv = _offloading(frozenset())
    h.abort("the store to host failed")
    assert h.final
    assert held(p.dst) == {}
    assert len(p.src.alloc.blocks_of("r")) == 3
    assert held(p.src) == {"owned": 3}


def test_a_cancelled_reload_gives_the_device_blocks_back_and_keeps_the_host_copy() -> None:
    p, h, kv = _offloading(frozenset())
    h.run()
    back = begin_reload(p.dst, geo(), p.src, geo(), "r", list(range(10)))
    back.round()
    assert back.receiver.state("r") is State.RECEIVING
    assert held(p.src) == {"reserved": 3}
    back.abort("cancelled")
    assert held(p.src) == {}
    assert len(p.dst.alloc.blocks_of("r")) == 3
    with pytest.raises(Exception, match="cancelled"):
        back.result()


def test_a_host_copy_whose_bytes_changed_at_rest_is_never_reloaded_as_a_hit() -> None:
    """A failed load served as a hit (issue #30's list; the spec's HostLoadFail, never
    HostLoadCommit, on unreadable bytes): the reload's Sender hashed the host blocks as
    they were at the reload, so a copy that changed after its offload committed was
    sealed and committed on the device as the request's KV, with no error. With the
    checksums taken at the commit (``begin_reload(checksums=)``) the device side checks
    every block: the reload fails, the device blocks go back, the host copy is kept.
    Failed before (no ``checksums=``: the rotten bytes loaded as a hit)."""
    p, h, kv = _offloading(frozenset())
    h.run()
    host = p.dst.alloc.blocks_of("r")
    sums = p.dst.checksums(host)  # taken when the offload committed
    p.dst.hm_block(0, host[1]).add_(1.0)  # the host copy's bytes change at rest
    back = begin_reload(p.dst, geo(), p.src, geo(), "r", list(range(10)), checksums=sums)
    with pytest.raises(ChecksumError, match="do not hash"):
        back.run()
    assert held(p.src) == {}  # nothing loaded, nothing reserved
    assert p.dst.alloc.blocks_of("r") == host  # the host copy kept (free_host: at commit)


def test_a_host_copy_reloads_whole_against_its_commit_checksums() -> None:
    p, h, kv = _offloading(frozenset())
    h.run()
    sums = p.dst.checksums(p.dst.alloc.blocks_of("r"))
    got = reload(p.dst, geo(), p.src, geo(), "r", list(range(10)), checksums=sums)
    assert torch.equal(read_kv(p.src, got.received.blocks, 10), kv)
    assert held(p.dst) == {}
