"""What the API tour tests share: a world's pair tour checked against its pinned
coverage, and the Hypothesis machine's walk of a world on the API."""

from __future__ import annotations

import dataclasses
from typing import Any

from refimpl.testing.on_api.adapter import ApiAdapter
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.tour import ApiPlan, api_report, run_api_tour
from refimpl.testing.worlds import get_world


def first_lines(res: Any) -> list[str]:
    """The first line of each of a tour's first five failures."""
    return [str(e).splitlines()[0] for _, e in res.failures[:5]]


def walks_to(plan: ApiPlan, action: str) -> ApiPlan:
    """``plan`` with each walk that takes ``action`` cut after its first ``action`` step
    (the same prefix once), the others left out: a bug switch that the walk's first
    ``action`` (or the refusal probes of the state it reaches) catches is caught by these
    prefixes alone, without replaying the walks' rests and the walks that never take
    ``action`` (where a divergence ends a walk, the full tour's failures are these)."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for seq in plan.sequences:
        at = next((k for k, st in enumerate(seq) if st["action"] == action), None)
        if at is not None:
            cut = seq[: at + 1]
            seen.setdefault(repr(cut), cut)
    return dataclasses.replace(plan, sequences=list(seen.values()))


def walks_to_early_ends(plan: ApiPlan) -> ApiPlan:
    """An unrevocable world's edge walks that resume after a Nack or time out, each to
    that step (``walks_to``): where the tour hands the Senders a Nack or the engine's
    abort while writes are in flight (``on_api.early``), in a quarter of the steps."""
    cuts = [walks_to(plan, a).sequences for a in ("PrefillResume", "PrefillTimeout")]
    return dataclasses.replace(plan, sequences=[s for cut in cuts for s in cut])


def assert_every_pair(name: str, pinned: tuple[int, int]) -> None:
    """World ``name``'s pair tour on the API: (pairs, covered) as pinned, no divergence,
    the refusal probes run."""
    plan = plan_api_pairs(get_world(name))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["pairs"], rep["pairs_covered"]) == pinned, rep["pairs_missed"]
    assert not res.failures, first_lines(res)
    assert res.probes > 0


def assert_machine_walks(name: str, gaps: frozenset[str] = frozenset()) -> None:
    """The Hypothesis machine walks world ``name`` on the API (10 examples of 30 steps,
    derandomized) with no failure and no gap but those named in ``gaps`` (an example
    ends at a known gap, ``on_api.machine``)."""
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from refimpl.testing.on_api.machine import ApiTally, make_api_machine

    tally = ApiTally()
    machine = make_api_machine(ApiAdapter(), get_world(name), tally=tally)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=10,
            stateful_step_count=30,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert tally.failures == 0 and tally.examples >= 10 and tally.steps > 30
    assert set(tally.gaps) <= gaps, tally.gaps
