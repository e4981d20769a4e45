"""The pair tour on the API (issue #30): every reachable (action, outcome) pair of a large
world, on real Senders/Receiver.

A large world's closed graph (``tour.closed_graph``: the spec closed under the API's
eager steps) is explored whole, but its edges are too many to replay on real objects
(``handoff_tp2to1``: 40,702 closed states, 259,421 edges). The pair goal is the one the
engine's tour takes on such worlds (``refimpl.testing.tour``, "pairs"): each (action,
outcome) pair the closed system offers, "ok" by an edge and "refused:<property>" by a
refusal probe the API can judge (``tour.api_probes``), at the shallowest closed state
that offers it, reached by the BFS-tree path; a path that is a prefix of another is
dropped. ``tour.run_api_tour`` replays the paths with the refinement map, every safety
property, the content ghost and the probes after every step, as on the small worlds.
"""

from __future__ import annotations

import time

from model_checks.explicit.explore import explore
from refimpl.testing.coverage import edge_key
from refimpl.testing.on_api.tour import ApiPlan, ClosedGraph, closed_graph, judged
from refimpl.testing.probes import MSG_ACTIONS, spec_refusals
from refimpl.testing.tour import _without_prefixes, first_pairs
from spec.actions import encode_args
from spec.config import Config
from spec.state import World

__all__ = ["Pair", "api_refusals", "first_api_pairs", "plan_api_pairs"]

Pair = tuple[str, str]


def api_refusals(w: World, c: Config) -> list[tuple[str, int, int, str | None]]:
    """The spec's refusals at ``w`` that the API can judge (``tour.api_probes``' filter,
    on a state): a message action for a message not in flight, and ``judged`` ones."""
    out = []
    for name, i, arg, prop in spec_refusals(w, c):
        if name in MSG_ACTIONS and arg not in w.reqs[i].net or judged(name, c):
            out.append((name, i, arg, prop))
    return out


def first_api_pairs(g: ClosedGraph) -> dict[Pair, tuple[int, int | None]]:
    """Each pair the closed graph offers, with the shallowest state offering it (its ids
    are in BFS order) and, for "ok", the edge."""
    return first_pairs(g, None, api_refusals)  # type: ignore[arg-type]


def _tree(g: ClosedGraph) -> list[int]:
    """The BFS tree: the edge that found each state (-1 for the initial one)."""
    parent = [-1] * g.n_states
    for e in range(g.n_edges):  # edges are in BFS order: the first into a state found it
        d = g.dst[e]
        if d and parent[d] < 0:
            parent[d] = e
    return parent


def _path(g: ClosedGraph, parent: list[int], sid: int) -> list[int]:
    out = []
    while sid:
        e = parent[sid]
        out.append(e)
        sid = g.src[e]
    return out[::-1]


def plan_api_pairs(c: Config) -> ApiPlan:
    """The pair tour of ``c`` on the API (see the module doc)."""
    t0 = time.process_time()
    g = closed_graph(c)
    found = first_api_pairs(g)
    parent = _tree(g)
    paths = [
        [g.lab[e] for e in _path(g, parent, s) + ([] if e is None else [e])]
        for s, e in found.values()
    ]
    seqs = [
        [{"action": lab[0], "args": encode_args(*lab)} for lab in walk]
        for walk in _without_prefixes(paths)
    ]
    keys = frozenset(edge_key(g.states[g.src[e]], *g.lab[e]) for e in range(g.n_edges))
    spec = explore(c)
    return ApiPlan(
        c,
        seqs,
        g.n_states,
        keys,
        spec.n_states,
        spec.n_edges,
        time.process_time() - t0,
        goal="pairs",
        pairs=frozenset(found),
    )
