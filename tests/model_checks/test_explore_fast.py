"""The explorer's fast paths change nothing: the same edges as ``spec.actions.successors``
(in its order), the same SCCs as networkx, the same records as NamedTuple's own
``_replace``; and the per-edge hook for transition properties finds shallowest edges."""

from __future__ import annotations

import random
from collections import namedtuple

import networkx as nx
import pytest

from model_checks.explicit.enabling import Enabling, _disabled, _KeyWorld
from model_checks.explicit.explore import Graph, explore
from model_checks.explicit.liveness import sccs
from model_checks.explicit.runner import check_config
from model_checks.explicit.verdicts import Verdicts, key_of
from spec.actions import ACTIONS, Action, apply, successors
from spec.common import NOT_ENABLED, Result
from spec.config import CONFIGS, SCALE, Config
from spec.invariants import for_config as invariants_for
from spec.properties import SAFETY
from spec.state import RUNNING, Req, World, canonical

CASES = [
    ("handoff_crash", frozenset()),
    ("offload_contend", frozenset()),
    ("scale_2", frozenset()),
    ("handoff_crash", frozenset({"sweep_only_on_admit"})),
    ("handoff_crash", frozenset({"no_timeout_while_filling", "free_on_cancel_in_flight"})),
    ("offload_contend", frozenset({"preempt_during_store", "reload_during_store"})),
    ("turns_append", frozenset()),  # the turn guards read tn/ti/tdv/tc, outside the key
    ("turns_append", frozenset({"two_writers_on_session", "evict_pinned_session"})),
]


def _cfg(name: str) -> Config:
    return {**CONFIGS, **SCALE}[name]


@pytest.mark.parametrize(("name", "mutants"), CASES)
def test_every_state_has_exactly_the_spec_successors(name: str, mutants: frozenset[str]) -> None:
    c = _cfg(name)
    g = explore(c, mutants)
    index = {w: i for i, w in enumerate(g.states)}
    assert len(index) == g.n_states
    for sid, w in enumerate(g.states):
        want = [(a, i, x, index[canonical(s)]) for a, i, x, s in successors(w, c, mutants)]
        got = [(*g.lab[e], g.dst[e]) for e in g.out_edges(sid)]
        assert got == want, f"{name} state {sid}"


SAFETY_CASES = [
    ("handoff_crash", frozenset({"free_on_cancel_in_flight", "source_writes_while_frozen"})),
    ("offload_contend", frozenset({"preempt_during_store", "failed_store_visible"})),
    ("offload_contend", frozenset({"reload_during_store"})),
    ("scale_2", frozenset({"partial_as_complete", "cancel_ignored"})),
]


@pytest.mark.parametrize(("name", "mutants"), SAFETY_CASES)
def test_first_violations_are_those_of_every_predicate_on_every_state(
    name: str, mutants: frozenset[str]
) -> None:
    c = _cfg(name)
    g = explore(c, mutants)
    want: dict[str, int] = {}
    preds = [(p.id, p.pred) for p in SAFETY if p.pred is not None] + invariants_for(c)
    for sid, w in enumerate(g.states):
        for pid, pred in preds:  # the properties, then INVARIANTS.md's conjuncts
            if pid not in want and not pred(w, c):
                want[pid] = sid
    assert g.first_violation == want
    assert want  # the mutants do break something here


def test_a_guard_read_outside_the_key_keeps_the_action() -> None:
    c = CONFIGS["handoff_tp2to1"]

    def reads_net(w: World, c: Config, m: frozenset[str], i: int, arg: int) -> Result:
        r = w.reqs[i]
        return NOT_ENABLED if not r.net or r.st != RUNNING else w  # net is read first

    def reads_key(w: World, c: Config, m: frozenset[str], i: int, arg: int) -> Result:
        return NOT_ENABLED if w.reqs[i].st != RUNNING else w

    queued = (0, 0, 0, 0, 0, 0, 0)  # st, p, d, h, ep, dep, ps
    kw = _KeyWorld(1, 0, True, True, 0, queued)
    running = _KeyWorld(1, 0, True, True, 0, (RUNNING, *queued[1:]))
    for fn, disabled in ((reads_net, False), (reads_key, True)):
        a = Action(fn.__name__, "P", "local", "req", fn)
        assert _disabled(a, kw, c, frozenset(), 0, 0) is disabled
        assert _disabled(a, running, c, frozenset(), 0, 0) is False  # net, or enabled
    en = Enabling(c, frozenset())
    initial = en.req((0, True, True, 0, *queued))
    assert [a.name for a in initial] == ["PrefillAdmit", "ClientCancel"]
    assert en.learned == 1


def _graph(n: int, edges: list[tuple[int, int]]) -> Graph:
    g = Graph(config=CONFIGS["handoff_crash"], mutants=frozenset(), symmetry=False)
    g.states = [World(reqs=())] * n
    for s in range(n):
        g.first_edge.append(len(g.src))
        for a, b in edges:
            if a == s:
                g.src.append(a)
                g.dst.append(b)
                g.lab.append(("PrefillRun", 0, 0))
    return g


def _nx_cyclic(g: nx.DiGraph) -> list[list[int]]:
    out = []
    for comp in nx.strongly_connected_components(g):
        n = next(iter(comp))
        if len(comp) > 1 or g.has_edge(n, n):
            out.append(sorted(comp))
    return sorted(out)


@pytest.mark.parametrize("seed", range(20))
def test_sccs_match_networkx_on_random_graphs(seed: int) -> None:
    rnd = random.Random(seed)
    n = rnd.randint(1, 60)
    edges = sorted({(rnd.randrange(n), rnd.randrange(n)) for _ in range(rnd.randint(0, 3 * n))})
    g = _graph(n, edges)
    assert sorted(sorted(c) for c in sccs(g)) == _nx_cyclic(g.to_networkx())


def test_sccs_match_networkx_on_a_state_graph() -> None:
    g = explore(CONFIGS["handoff_crash"])
    got = sorted(sorted(c) for c in sccs(g))
    assert got == _nx_cyclic(g.to_networkx())
    assert len(got) > 10  # self-loops (DecodeStep) and real cycles are both there


def test_fast_replace_is_namedtuples_replace() -> None:
    for cls, sample in ((Req, Req(st=2, p=3, net=(17, 33))), (World, World(reqs=(Req(),)))):
        plain = namedtuple(cls.__name__, cls._fields)  # type: ignore[misc]
        rnd = random.Random(0)
        for _ in range(200):
            names = rnd.sample(cls._fields, rnd.randint(0, len(cls._fields)))
            kw = {f: rnd.randint(0, 9) for f in names}
            new = sample._replace(**kw)
            assert type(new) is cls
            assert tuple(new) == tuple(plain(*sample)._replace(**kw))
        with pytest.raises(TypeError, match="no_such_field"):
            sample._replace(no_such_field=1)


def test_the_edge_hook_sees_every_edge_and_keeps_the_shallowest() -> None:
    c = CONFIGS["handoff_crash"]
    seen: list[tuple[str, int, int]] = []

    def count(w: World, a: str, i: int, x: int, s: World, c: Config) -> bool:
        seen.append((a, i, x))
        return True

    def no_freeze(w: World, a: str, i: int, x: int, s: World, c: Config) -> bool:
        return a != "PrefillFreeze" or w.reqs[i].p == s.reqs[i].p  # breaks on every freeze

    g = explore(c, edge_props=[("Count", count), ("NoFreeze", no_freeze)])
    assert len(seen) == g.n_edges
    assert "Count" not in g.first_edge_violation
    sid, label, eidx = g.first_edge_violation["NoFreeze"]
    assert label[0] == "PrefillFreeze" and g.lab[eidx] == label and g.src[eidx] == sid
    freezes = [e for e in range(g.n_edges) if g.lab[e][0] == "PrefillFreeze"]
    assert g.depth[sid] == min(g.depth[g.src[e]] for e in freezes)
    w = c.initial()
    for name, i, arg in [*g.path_to(sid), label]:
        nxt = apply(w, c, frozenset(), name, i, arg)
        assert isinstance(nxt, World)
        w = canonical(nxt)
    stopped = explore(c, edge_props=[("NoFreeze", no_freeze)], stop_on="NoFreeze")
    assert stopped.n_states < g.n_states
    assert stopped.first_edge_violation["NoFreeze"][1][0] == "PrefillFreeze"


def test_the_summary_has_cpu_seconds() -> None:
    s = check_config("offload_contend").summary()
    assert isinstance(s["cpu_seconds"], float) and s["cpu_seconds"] > 0
    rate = s["states_per_cpu_second"]
    assert isinstance(rate, int) and abs(rate * s["cpu_seconds"] - 734) < 734 * 0.05


def test_action_registry_order_is_what_the_explorer_follows() -> None:
    en = Enabling(CONFIGS["handoff_tp2to1"], frozenset())
    names = [a.name for a in en.req_actions]
    assert names == [a.name for a in ACTIONS.values() if a.arg == "req"]


def test_a_verdict_that_needs_more_than_the_key_is_left_to_the_predicate() -> None:
    c = CONFIGS["handoff_tp2to1"]

    def no_net(w: World, c: Config) -> bool:
        return all(not r.net for r in w.reqs)

    def not_running(w: World, c: Config) -> bool:
        return all(r.st != RUNNING for r in w.reqs)

    v = Verdicts(c, [("NoNet", no_net), ("NotRunning", not_running)])
    idle = World(reqs=(Req(),))
    running = World(reqs=(Req(st=RUNNING),))
    assert [(pid, verdict) for pid, _, verdict in v.plan(key_of(idle))] == [("NoNet", None)]
    plan = [(pid, verdict) for pid, _, verdict in v.plan(key_of(running))]
    assert plan == [("NoNet", None), ("NotRunning", False)]
    assert v.learned == 2
