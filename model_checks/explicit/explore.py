"""Explicit-state exploration: BFS from the initial state over interned states.

States are interned into int ids once (``Graph.states[id]``); edges are three parallel
arrays (``src``, ``dst``, ``lab``: the action name and its arguments), appended state by
state so a state's out-edges are one range (``first_edge``). Liveness runs on these
arrays; ``Graph.to_networkx`` builds a networkx.DiGraph on demand (DOT export,
callers). Every safety property is evaluated on every new state and every transition
property (``edge_props``) on every edge; the first (shallowest) violation of each is
remembered, so its shortest counterexample is one parent walk away.

Speed (see benchmarks/RESULTS.md): two cores give the same graph (the same states, ids,
edges, labels and first violations). The *plain* core generates successors inline,
skipping actions that ``enabling.Enabling`` has learned to be disabled for a state's
control fields; symmetry is one sort of the request records. The *local* core
(``local.py``) learns each request's edges once per (slot, record, globals) and keys
the visited set by interned record ids: it pays where requests repeat their records
across states (worlds of two or more requests); ``core="auto"`` takes it there. Safety
predicates whose verdict ``verdicts.Verdicts`` has learned from the control fields are
not called in either. ``por=True`` adds partial-order reduction (``por.py``): fewer
states, the same safety and transition verdicts; it is off by default (the pinned
state counts are of the full graph) and liveness is not checked on its graph.

The transition predicates of ``spec/steps.py`` are evaluated on every edge, on the
pre-state, the action and the post-state (``step_plain`` first: a cheap test that the
step cannot break any of them); the first violating edge per property is kept in
``Graph.first_step_violation`` (its counterexample: the path to the pre-state, then the
edge).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from model_checks.explicit.enabling import Enabling
from model_checks.explicit.graph import EdgePred, Graph, Label, Progress, Run
from model_checks.explicit.local import explore_local
from spec.actions import ACTIONS
from spec.common import Mutants
from spec.config import Config
from spec.state import World, canonical
from spec.steps import check_step, step_plain

__all__ = ["CORES", "EdgePred", "Graph", "Label", "Progress", "explore", "successor_fn"]

CORES = ("auto", "plain", "local")


Successor = tuple[str, int, int, World]  # (action, request slot, argument, successor)


def successor_fn(c: Config, mutants: Mutants = frozenset()) -> Callable[[World], list[Successor]]:
    """The successors of a state of ``c`` under ``mutants``, as one function.

    Exactly ``spec.actions.successors``, in its order (the edges' order, hence the state
    ids of a BFS), but actions that ``Enabling`` has learned to be disabled for a state's
    control fields are not called. Successors are not symmetry-reduced (slot ``i`` of the
    successor is slot ``i`` of the state). ``explore`` and ``parallel`` both expand with it.
    """
    en = Enabling(c, mutants)
    req_cands, msg_cands = en.req, en.msg
    glob = tuple(a for a in ACTIONS.values() if a.arg == "global")
    crash = ACTIONS["EnvCrash"].fn if "crash" in c.fault_kinds else None
    restart = ACTIONS["EnvRestart"].fn if c.restarts else None
    n = c.n_reqs
    World_ = World

    def successors(w: World) -> list[Successor]:
        out: list[Successor] = []
        gk = (w.p_up, w.d_up, w.faults)
        for i in range(n):
            r = w.reqs[i]
            key = (i, *gk, *r[:7])
            for a in req_cands(key):
                s = a.fn(w, c, mutants, i, 0)
                if type(s) is World_:
                    out.append((a.name, i, 0, s))
            seen = -1
            for code in r.net:
                if code == seen:
                    continue
                seen = code
                for a in msg_cands(key, code):
                    s = a.fn(w, c, mutants, i, code)
                    if type(s) is World_:
                        out.append((a.name, i, code, s))
        for a in glob:
            s = a.fn(w, c, mutants, 0, 0)
            if type(s) is World_:
                out.append((a.name, 0, 0, s))
        if crash is not None:
            for wk in (0, 1):
                s = crash(w, c, mutants, 0, wk)
                if type(s) is World_:
                    out.append(("EnvCrash", 0, wk, s))
        if restart is not None:
            for wk in (0, 1):
                s = restart(w, c, mutants, 0, wk)
                if type(s) is World_:
                    out.append(("EnvRestart", 0, wk, s))
        return out

    return successors


def explore(
    c: Config,
    mutants: Mutants = frozenset(),
    *,
    symmetry: bool = True,
    stop_on: str | None = None,
    max_states: int = 2_000_000,
    progress: Progress | None = None,
    edge_props: Sequence[tuple[str, EdgePred]] = (),
    core: str = "auto",
    por: bool = False,
) -> Graph:
    """Breadth-first exploration of every reachable state of ``c`` under ``mutants``.

    ``stop_on``: a property ID; exploration stops once a state (or, for an edge
    property, an edge) violating it is found (its shortest counterexample is known then).
    ``"*"``: stop at the first violation of any property (mutation testing asks only
    "killed or not").
    ``edge_props``: transition properties checked on every edge; the first (shallowest)
    violating edge of each is kept in ``Graph.first_edge_violation``.
    ``core``: "plain", "local" or "auto" (local for two or more requests); the same graph.
    ``por``: partial-order reduction (the local core; a smaller graph, see ``por.py``).

    Successors are exactly ``spec.actions.successors``, in its order; actions known to
    be disabled are not called.
    """
    if core not in CORES:
        raise ValueError(f"unknown core {core!r}; valid cores: {', '.join(CORES)}")
    g = Graph(config=c, mutants=mutants, symmetry=symmetry)
    run = Run(g, stop_on, max_states, progress, edge_props)
    if por or core == "local" or (core == "auto" and c.n_reqs > 1):
        return explore_local(run, symmetry, por)
    return _plain(run, symmetry)


def _plain(run: Run, symmetry: bool) -> Graph:
    """The plain core: every candidate action called on every state."""
    g, c, mutants = run.g, run.c, run.m
    stop_on, edge_props, check, check_edge = run.stop_on, run.edge_props, run.check, run.check_edge
    progress = run.progress
    init = canonical(c.initial()) if symmetry else c.initial()
    index: dict[World, int] = {init: 0}
    g.states.append(init)
    g.depth.append(0)
    g.parent.append(0)
    g.parent_label.append(("", 0, 0))
    first_step = g.first_step_violation
    states, depth, parent, plabel = g.states, g.depth, g.parent, g.parent_label
    src, dst, lab = g.src, g.dst, g.lab
    first_edge = g.first_edge
    successors = successor_fn(c, mutants)
    multi = symmetry and c.n_reqs > 1

    if check(0, init):
        return run.done()
    head = 0
    while head < len(states):
        sid = head
        w = states[sid]
        head += 1
        d1 = depth[sid] + 1
        first_edge.append(len(src))
        for name, i, arg, s0 in successors(w):
            lb = (name, i, arg)
            stop = False
            if not step_plain(w, name, i, arg, s0, c):
                for pid in check_step(w, name, i, arg, s0, c):
                    if pid not in first_step:
                        first_step[pid] = len(src)  # the index this edge gets below
                        stop = stop or pid == stop_on or stop_on == "*"
            s = s0
            if multi:
                reqs = s.reqs
                srt = tuple(sorted(reqs))
                if srt != reqs:
                    s = s._replace(reqs=srt)
            tid = index.get(s)
            if tid is None:
                tid = len(states)
                index[s] = tid
                states.append(s)
                depth.append(d1)
                parent.append(sid)
                plabel.append(lb)
                if check(tid, s):
                    src.append(sid)
                    dst.append(tid)
                    lab.append(lb)
                    return run.done()
                run.too_many(tid)
            if edge_props and check_edge(sid, w, lb, s0, len(src)):
                src.append(sid)
                dst.append(tid)
                lab.append(lb)
                return run.done()
            src.append(sid)
            dst.append(tid)
            lab.append(lb)
            if stop:
                return run.done()
        if progress is not None and head % 4096 == 0:
            progress(len(states), len(states) - head)
    return run.done()
