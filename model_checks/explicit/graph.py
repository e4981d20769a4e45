"""The explored state graph (``Graph``) and one exploration's bookkeeping (``Run``).

States are interned into int ids once (``Graph.states[id]``); edges are three parallel
arrays (``src``, ``dst``, ``lab``: the action name and its arguments), appended state by
state so a state's out-edges are one range (``first_edge``). ``Run`` holds what both
exploration loops (``explore``'s plain one and ``local``'s) share: the safety check of
a new state (the predicates ``verdicts.Verdicts`` has not settled from the control
fields), the transition properties given by the caller, and when to stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from model_checks.explicit.verdicts import Verdicts, key_of, state_preds
from spec.common import Mutants
from spec.config import Config
from spec.state import World

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


class StateBound(Exception):
    """The exploration reached its state bound: a verdict on the states explored only
    (``kvown check`` exit 4), not an error. ``violated``: the safety properties violated
    on the states explored (None: not known, as with the parallel explorer)."""

    def __init__(self, config: str, bound: int, violated: list[str] | None) -> None:
        self.config, self.bound, self.violated = config, bound, violated
        held = (
            "the properties' verdicts on them are not collected"
            if violated is None
            else f"violated on them: {', '.join(violated)}"
            if violated
            else "every safety property held on them"
        )
        super().__init__(
            f"config {config}: state bound reached, {bound} states explored ({held});"
            " no verdict on the states beyond"
        )


class Run:
    """One exploration: the graph being built, the checks, the stop condition."""

    def __init__(
        self,
        g: Graph,
        stop_on: str | None,
        max_states: int,
        progress: Progress | None,
        edge_props: Sequence[tuple[str, EdgePred]],
    ) -> None:
        self.g, self.c, self.m = g, g.config, g.mutants
        self.stop_on, self.stop_any = stop_on, stop_on == "*"
        self.max_states, self.progress, self.edge_props = max_states, progress, edge_props
        self.t0 = time.perf_counter()
        self.plan = Verdicts(self.c, state_preds(self.c)).plan

    def stops(self, pid: str) -> bool:
        return pid == self.stop_on or self.stop_any

    def check(self, sid: int, w: World) -> bool:
        """Safety on a new state; True: stop (a property asked for is violated)."""
        first, c = self.g.first_violation, self.c
        # the predicates whose verdict the state's control fields do not settle as "holds"
        for pid, pred, verdict in self.plan(key_of(w)):
            if pid not in first and not (pred(w, c) if verdict is None else verdict):
                first[pid] = sid
                if self.stops(pid):
                    return True
        return False

    def check_edge(self, sid: int, w: World, lb: Label, s: World, eidx: int) -> bool:
        """The caller's transition properties on one edge; True: stop."""
        edge_first, c = self.g.first_edge_violation, self.c
        for pid, epred in self.edge_props:
            if pid not in edge_first and not epred(w, lb[0], lb[1], lb[2], s, c):
                edge_first[pid] = (sid, lb, eidx)
                if self.stops(pid):
                    return True
        return False

    def done(self) -> Graph:
        self.g.seconds = time.perf_counter() - self.t0
        return self.g

    def too_many(self, tid: int) -> None:
        if tid >= self.max_states:
            raise StateBound(self.c.name, self.max_states, sorted(self.g.first_violation))
