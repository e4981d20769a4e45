"""Explicit-state exploration: BFS from the initial state into a networkx.DiGraph.

States are interned into int ids once (``Graph.states[id]``); the graph holds ints.
Edges carry the action name and its arguments (``label``) and the action kind
(``kinds``, a set: parallel actions between the same two states are merged). Every
safety property is evaluated on every state; the first (shallowest) state violating
each property is remembered, so its shortest counterexample is one parent walk away.
The transition predicates (``spec/steps.py``) are evaluated on every edge, on the
pre-state, the action and the post-state; the first violating edge per property is
remembered likewise (its counterexample: the path to the pre-state, then the edge).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from spec.actions import successors
from spec.common import Mutants
from spec.config import Config
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


def explore(
    c: Config,
    mutants: Mutants = frozenset(),
    *,
    symmetry: bool = True,
    stop_on: str | None = None,
    max_states: int = 2_000_000,
    progress: Progress | None = None,
) -> Graph:
    """Breadth-first exploration of every reachable state of ``c`` under ``mutants``.

    ``stop_on``: a property ID; exploration stops once a state violating it is found
    (the shortest counterexample is already known then). ``"*"``: stop at the first
    violation of any safety property (mutation testing asks only "killed or not").
    """
    t0 = time.perf_counter()
    g = Graph(config=c, mutants=mutants, symmetry=symmetry)
    norm = canonical if symmetry else (lambda w: w)
    init = norm(c.initial())
    index: dict[World, int] = {init: 0}
    g.states.append(init)
    g.depth.append(0)
    g.parent.append(0)
    g.parent_label.append(("", 0, 0))
    preds = [(p.id, p.pred) for p in SAFETY if p.pred is not None]
    first = g.first_violation
    first_step = g.first_step_violation
    states, depth, parent, plabel = g.states, g.depth, g.parent, g.parent_label
    src, dst, lab = g.src, g.dst, g.lab
    first_edge = g.first_edge

    def check(sid: int, w: World) -> bool:
        for pid, pred in preds:
            if pid not in first and not pred(w, c):
                first[pid] = sid
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
        for name, i, arg, s in successors(w, c, mutants):
            stop = False
            if not step_plain(w, name, i, arg, s, c):
                for pid in check_step(w, name, i, arg, s, c):
                    if pid not in first_step:
                        first_step[pid] = len(src)  # the index this edge gets below
                        stop = stop or pid == stop_on or stop_on == "*"
            s = norm(s)
            tid = index.get(s)
            if tid is None:
                tid = len(states)
                index[s] = tid
                states.append(s)
                depth.append(d1)
                parent.append(sid)
                plabel.append((name, i, arg))
                if check(tid, s):
                    src.append(sid)
                    dst.append(tid)
                    lab.append((name, i, arg))
                    g.seconds = time.perf_counter() - t0
                    return g
                if tid >= max_states:
                    raise RuntimeError(f"config {c.name}: more than {max_states} states")
            src.append(sid)
            dst.append(tid)
            lab.append((name, i, arg))
            if stop:
                g.seconds = time.perf_counter() - t0
                return g
        if progress is not None and head % 4096 == 0:
            progress(len(states), len(states) - head)
    g.seconds = time.perf_counter() - t0
    return g
