"""Explicit-state exploration: BFS from the initial state over interned states.

States are interned into int ids once (``Graph.states[id]``); edges are three parallel
arrays (``src``, ``dst``, ``lab``: the action name and its arguments), appended state by
state so a state's out-edges are one range (``first_edge``). Liveness runs on these
arrays; ``Graph.to_networkx`` builds a networkx.DiGraph on demand (DOT export,
callers). Every safety property is evaluated on every new state and every transition
property (``edge_props``) on every edge; the first (shallowest) violation of each is
remembered, so its shortest counterexample is one parent walk away.

Speed (see benchmarks/RESULTS.md): successors are generated inline, actions that
``enabling.Enabling`` has learned to be disabled for a state's control fields are not
called, safety predicates whose verdict ``verdicts.Verdicts`` has learned from those
fields are not called either, and symmetry is one sort of the request records.

The transition predicates of ``spec/steps.py`` are evaluated on every edge, on the
pre-state, the action and the post-state (``step_plain`` first: a cheap test that the
step cannot break any of them); the first violating edge per property is kept in
``Graph.first_step_violation`` (its counterexample: the path to the pre-state, then the
edge).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from model_checks.explicit.enabling import Enabling
from model_checks.explicit.verdicts import Verdicts, key_of
from spec.actions import ACTIONS
from spec.common import Mutants
from spec.config import Config
from spec.invariants import for_config as invariants_for
from spec.properties import SAFETY
from spec.state import World, canonical
from spec.steps import check_step, step_plain

Label = tuple[str, int, int]  # (action, request slot in the canonical pre-state, argument)


@dataclass
class Graph:
    config: Config
    mutants: Mutants
    symmetry: bool
    states: list[World] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    parent_label: list[Label] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    lab: list[Label] = field(default_factory=list)
    first_violation: dict[str, int] = field(default_factory=dict)
    # per edge property: (pre-state id, label, edge index) of its first violating edge
    first_edge_violation: dict[str, tuple[int, Label, int]] = field(default_factory=dict)
    first_edge: list[int] = field(default_factory=list)
    first_step_violation: dict[str, int] = field(default_factory=dict)  # pid -> edge index
    seconds: float = 0.0
    _nx: nx.DiGraph | None = None

    @property
    def n_states(self) -> int:
        return len(self.states)

    @property
    def n_edges(self) -> int:
        return len(self.src)

    @property
    def max_depth(self) -> int:
        return max(self.depth) if self.depth else 0

    def path_to(self, sid: int) -> list[Label]:
        """Labels along the BFS tree from the initial state to ``sid`` (a shortest path)."""
        out: list[Label] = []
        while sid != 0:
            out.append(self.parent_label[sid])
            sid = self.parent[sid]
        out.reverse()
        return out

    def step_path(self, edge: int) -> list[Label]:
        """A shortest path that ends with edge ``edge`` (BFS reached its source first)."""
        return [*self.path_to(self.src[edge]), self.lab[edge]]

    def violation_path(self, pid: str) -> list[Label] | None:
        """The shorter of the state and the step counterexample of ``pid`` (None: holds)."""
        paths = []
        if pid in self.first_violation:
            paths.append(self.path_to(self.first_violation[pid]))
        if pid in self.first_step_violation:
            paths.append(self.step_path(self.first_step_violation[pid]))
        return min(paths, key=len) if paths else None

    def to_networkx(self) -> nx.DiGraph:
        """The state graph as a networkx.DiGraph over state ids (parallel actions between
        two states merge into one edge; ``edge_label`` names one of them)."""
        if self._nx is None:
            g = nx.DiGraph()
            g.add_nodes_from(range(self.n_states))
            g.add_edges_from(zip(self.src, self.dst, strict=True))
            self._nx = g
        return self._nx

    def out_edges(self, sid: int) -> range:
        """Indices (into src/dst/lab) of the edges leaving ``sid``: BFS appends them
        contiguously."""
        if sid >= len(self.first_edge):
            return range(0)  # not expanded (exploration stopped early)
        start = self.first_edge[sid]
        end = self.first_edge[sid + 1] if sid + 1 < len(self.first_edge) else len(self.src)
        return range(start, end)


Progress = Callable[[int, int], None]  # (states so far, frontier size)

# A transition property: (pre-state, action, request slot, argument, post-state, config)
# -> holds. ``post`` is the successor before symmetry reduction, so slot ``i`` names the
# same request in both states. Evaluated on every edge (new state or not).
EdgePred = Callable[[World, str, int, int, World, Config], bool]


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
) -> Graph:
    """Breadth-first exploration of every reachable state of ``c`` under ``mutants``.

    ``stop_on``: a property ID; exploration stops once a state (or, for an edge
    property, an edge) violating it is found (its shortest counterexample is known then).
    ``"*"``: stop at the first violation of any property (mutation testing asks only
    "killed or not").
    ``edge_props``: transition properties checked on every edge; the first (shallowest)
    violating edge of each is kept in ``Graph.first_edge_violation``.

    Successors are exactly ``spec.actions.successors``, in its order; actions that
    ``Enabling`` has learned to be disabled for a state's control fields are not called.
    """
    t0 = time.perf_counter()
    g = Graph(config=c, mutants=mutants, symmetry=symmetry)
    init = canonical(c.initial()) if symmetry else c.initial()
    index: dict[World, int] = {init: 0}
    g.states.append(init)
    g.depth.append(0)
    g.parent.append(0)
    g.parent_label.append(("", 0, 0))
    preds = [(p.id, p.pred) for p in SAFETY if p.pred is not None]
    preds += invariants_for(c)  # INVARIANTS.md's conjuncts, by name, on every new state
    first = g.first_violation
    edge_first = g.first_edge_violation
    first_step = g.first_step_violation
    states, depth, parent, plabel = g.states, g.depth, g.parent, g.parent_label
    src, dst, lab = g.src, g.dst, g.lab
    first_edge = g.first_edge
    successors = successor_fn(c, mutants)
    multi = symmetry and c.n_reqs > 1

    plan = Verdicts(c, preds).plan

    def check(sid: int, w: World) -> bool:
        # the predicates whose verdict the state's control fields do not settle as "holds"
        for pid, pred, verdict in plan(key_of(w)):
            if pid not in first and not (pred(w, c) if verdict is None else verdict):
                first[pid] = sid
                if pid == stop_on or stop_on == "*":
                    return True
        return False

    def check_edge(sid: int, w: World, lb: Label, s: World, eidx: int) -> bool:
        for pid, epred in edge_props:
            if pid not in edge_first and not epred(w, lb[0], lb[1], lb[2], s, c):
                edge_first[pid] = (sid, lb, eidx)
                if pid == stop_on or stop_on == "*":
                    return True
        return False

    if check(0, init):
        g.seconds = time.perf_counter() - t0
        return g
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
                    g.seconds = time.perf_counter() - t0
                    return g
                if tid >= max_states:
                    raise RuntimeError(f"config {c.name}: more than {max_states} states")
            if edge_props and check_edge(sid, w, lb, s0, len(src)):
                src.append(sid)
                dst.append(tid)
                lab.append(lb)
                g.seconds = time.perf_counter() - t0
                return g
            src.append(sid)
            dst.append(tid)
            lab.append(lb)
            if stop:
                g.seconds = time.perf_counter() - t0
                return g
        if progress is not None and head % 4096 == 0:
            progress(len(states), len(states) - head)
    g.seconds = time.perf_counter() - t0
    return g
