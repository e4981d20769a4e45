"""The explorer's two cores build the same graph, and partial-order reduction keeps the
verdicts (issue #25): the local core (``model_checks/explicit/local.py``) against the
plain one, state by state and edge by edge, with and without symmetry, with mutants;
POR (``por.py``) against the full graph: the same safety and transition verdicts, never
more states, and the mutants it must catch still caught."""

from __future__ import annotations

import pytest

from model_checks.explicit.explore import Graph, explore
from model_checks.explicit.runner import check_config
from spec.config import get_config
from spec.mutants import get_mutant

CASES = [
    ("offload_contend", frozenset(), True),
    ("offload_contend", frozenset(), False),
    ("scale_2", frozenset(), True),
    ("handoff_crash", frozenset(), True),
    ("offload_contend", frozenset({"preempt_during_store", "failed_store_visible"}), True),
]


def _same(a: Graph, b: Graph) -> None:
    assert a.states == b.states
    assert (a.src, a.dst, a.lab, a.first_edge) == (b.src, b.dst, b.lab, b.first_edge)
    assert (a.depth, a.parent, a.parent_label) == (b.depth, b.parent, b.parent_label)
    assert a.first_violation == b.first_violation
    assert a.first_step_violation == b.first_step_violation


@pytest.mark.parametrize(("name", "mutants", "symmetry"), CASES)
def test_local_core_builds_the_plain_cores_graph(
    name: str, mutants: frozenset[str], symmetry: bool
) -> None:
    c = get_config(name)
    plain = explore(c, mutants, symmetry=symmetry, core="plain")
    local = explore(c, mutants, symmetry=symmetry, core="local")
    _same(plain, local)


def test_local_core_stops_where_the_plain_core_stops() -> None:
    c = get_config("offload_contend")
    m = frozenset({"failed_store_visible"})
    for stop in ("PublishAfterCommit", "*"):
        _same(explore(c, m, core="plain", stop_on=stop), explore(c, m, core="local", stop_on=stop))


def test_the_local_core_runs_the_callers_edge_properties_on_real_edges() -> None:
    seen: list[tuple[str, int]] = []

    def never_twice(pre: object, name: str, i: int, arg: int, post: object, c: object) -> bool:
        seen.append((name, i))
        return name != "PrefillAdmit" or i != 1

    c = get_config("offload_contend")
    g = explore(c, core="local", edge_props=[("NoSecondAdmit", never_twice)])
    sid, lb, eidx = g.first_edge_violation["NoSecondAdmit"]
    assert lb[:2] == ("PrefillAdmit", 1) and g.lab[eidx] == lb and g.src[eidx] == sid
    assert len(seen) == eidx + 1  # on every edge until the first violating one


def test_an_unknown_core_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown core 'fast'; valid cores: auto, plain, local"):
        explore(get_config("offload_contend"), core="fast")


@pytest.mark.parametrize("name", ["offload_contend", "scale_2"])
def test_por_keeps_the_safety_and_transition_verdicts(name: str) -> None:
    full = check_config(name, liveness=False)
    red = check_config(name, liveness=False, por=True)
    assert sorted(red.violations) == sorted(full.violations)
    assert red.graph.n_states <= full.graph.n_states
    assert red.graph.n_edges < full.graph.n_edges  # ample sets were taken somewhere


@pytest.mark.parametrize(
    "mutant", ["failed_store_visible", "evict_referenced_prefix", "reload_during_store"]
)
def test_por_still_catches_the_safety_mutants(mutant: str) -> None:
    mu = get_mutant(mutant)
    got = [
        mu.expected
        in check_config(cn, frozenset({mutant}), stop_on=mu.expected, por=True).violations
        for cn in mu.configs
    ]
    assert any(got)


def test_por_skips_liveness() -> None:
    r = check_config("offload_contend", frozenset({"sweep_only_on_admit"}), por=True)
    full = check_config("offload_contend", frozenset({"sweep_only_on_admit"}))
    live = {"NoDeadlock", "FairTermination", "BoundedExit", "RecoverWithoutTimeout"}
    assert not live & set(r.violations) and set(full.violations) - set(r.violations) <= live
