"""Recompute preemption on the API tour (issue #30 item 1): ``offload_contend`` (two
requests contend for a 3-block device pool: offload/reload to host pools, preemption by
recompute, a failed store) toured edge by edge on the API with the refinement check,
the refusal probes and the content ghost. Preemption is the engine's scheduler's
decision (``on_api/worlds/recompute.py``); the API's part is the pin an in-flight store
holds on the device blocks (``Sender.held()`` of ``begin_offload``'s Sender), which the
scheduler must respect: the spec's ``PrefillPreempt`` refuses ``NoReuseUnderIO`` then.
Before this, the adapter refused every world with recompute."""

from __future__ import annotations

import pytest
import torch

from refimpl.errors import OwnershipError
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.tour import api_report, plan_api, run_api_tour
from refimpl.testing.on_api.worlds.recompute import RecomputeActions
from refimpl.testing.worlds import get_world
from spec.state import PREEMPTED
from tests.library.tours.tour_helpers import assert_every_pair, assert_machine_walks, walks_to

EDGES = {"offload_contend": (1090, 1090)}  # (closed edges, edges covered): measured


def test_offload_contend_is_toured_edge_by_edge_on_the_api_with_no_divergence() -> None:
    c = get_world("offload_contend")
    assert unexpressed(c) == []
    plan = plan_api(c)
    taken = {st["action"] for seq in plan.sequences for st in seq}
    assert {"PrefillPreempt", "EnvStoreFail", "PrefillReloadCommit"} <= taken
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES["offload_contend"], rep
    assert not res.failures, [str(e).splitlines()[0] for _, e in res.failures[:5]]
    assert res.probes > 0


def _subject() -> object:
    s = ApiAdapter().build(get_world("offload_contend"), frozenset(), 0)
    for name in ("PrefillAdmit", "PrefillRun", "PrefillDecodeStep"):
        s.step(name, {"req": 0})  # type: ignore[attr-defined]
    return s


def test_a_store_in_flight_pins_the_blocks_and_preemption_is_refused() -> None:
    s: object = _subject()
    s.step("PrefillOffloadBegin", {"req": 0})  # type: ignore[attr-defined]
    pinned = s.pinned_by_move(0)  # type: ignore[attr-defined]
    assert pinned == s.pp[0].alloc.blocks_of("r0")  # type: ignore[attr-defined]
    with pytest.raises(OwnershipError) as exc:
        s.step("PrefillPreempt", {"req": 0})  # type: ignore[attr-defined]
    assert exc.value.prop == "NoReuseUnderIO"
    s.step("EnvStoreFail", {"req": 0})  # type: ignore[attr-defined]
    assert s.pinned_by_move(0) == ()  # type: ignore[attr-defined]  # the abort unpinned
    s.step("PrefillPreempt", {"req": 0})  # type: ignore[attr-defined]
    assert s.st[0] == PREEMPTED and not s.pp[0].alloc.blocks_of("r0")  # type: ignore[attr-defined]
    s.step("PrefillAdmit", {"req": 0})  # type: ignore[attr-defined]
    s.step("PrefillRun", {"req": 0})  # type: ignore[attr-defined]  # computed again, whole
    want = s.model.content(0, 1)  # type: ignore[attr-defined]  # the prompt and its token
    assert torch.equal(s.replica(0, "p"), want)  # type: ignore[attr-defined]


def test_the_tour_judges_a_preemption_under_a_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal probes judge PrefillPreempt (``tour.judged``): a scheduler that does
    not read the store's pin refuses for another reason than the spec's NoReuseUnderIO,
    and the tour says so where a store is in flight: walked here to the state after each
    walk's first ``PrefillOffloadBegin`` (``walks_to``; the rest of the tour meets the
    same probes or none)."""
    monkeypatch.setattr(RecomputeActions, "pinned_by_move", lambda self, i: ())
    plan = walks_to(plan_api(get_world("offload_contend")), "PrefillOffloadBegin")
    res = run_api_tour(ApiAdapter(), plan)
    first = {str(e).splitlines()[0].split(": ", 1)[-1] for _, e in res.failures}
    assert res.failures
    assert {e.program[-1]["action"] for _, e in res.failures} == {"PrefillPreempt"}
    assert first == {"refused naming None, the spec names 'NoReuseUnderIO': a move holds it"}


def test_the_hypothesis_machine_walks_offload_contend_on_the_api() -> None:
    assert_machine_walks("offload_contend")


def test_offload_handoff_covers_every_pair_on_the_api() -> None:
    """Offload/reload and recompute, then a handoff; a store failure, a loss, a duplicate
    or a crash: every reachable (action, outcome) pair, no divergence."""
    assert_every_pair("offload_handoff", (49, 49))
