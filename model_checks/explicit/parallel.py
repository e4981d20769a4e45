"""Both cores: the explicit explorer's BFS over worker processes (``kvown check --workers N``).

Design (one machine). The visited set is partitioned: state ``s`` (canonical, after
symmetry) belongs to worker ``hash(s) % N`` (a hash of ints and tuples: the same in
every process), which alone interns it to a local id, runs the safety predicates on it
and expands it. The BFS is level-synchronous: at level ``d`` each worker expands its
frontier with the serial explorer's own ``successor_fn`` (the same actions, in the same
order), runs the transition predicates on each edge (pre-state, action, post-state: all
three are at hand there), and sends every successor it does not own to its owner, one
batch per peer per level through that peer's ``multiprocessing`` queue; a remote state
is pickled once per (sender, owner), later edges to it carry its index. The owner
interns what it receives and records the edge (source key, successor index, label, its
local id). When every worker has reported the level (states new to it, a violation to
stop on), the coordinator (the calling process) starts the next level or stops, so a
state's level is its BFS depth and counterexamples stay shortest.

At the end each worker sends its states, out-degrees, edges and violations to the
coordinator, which replays the serial BFS over these edges (a state's out-edges in
successor order, new states numbered in discovery order): the result is the very
``Graph`` the serial explorer builds, ids, edges, parents, shallowest violations and
all, so liveness (``liveness.py``), traces and pins run on it unchanged. With
``stop_on`` the workers finish the level of the first violation and the replay stops at
the edge where the serial explorer stops (the same states and counterexample).

Many machines. The design is that of distributed BFS model checkers (Stern & Dill's
parallel Murphi, DiVinE, PReach): nothing in it needs shared memory. On Ray, each
worker is an actor holding its partition; a level is one ``expand.remote(level)`` per
actor, the batches go to peers as ``ray.put`` object refs (or actor calls), and the
coordinator's barrier is ``ray.get`` on the level's futures. On torch.distributed
(gloo, CPU), the batches are pickled into byte tensors and exchanged with one
``all_to_all`` per level (sizes first, then payloads), and the stop/continue vote is an
``all_reduce``. What changes: (1) the final replay gathers the whole graph on one
machine; beyond its memory, safety verdicts stay distributed (each violation is known
by its owner with its level; its counterexample is rebuilt by walking parent keys,
each owner keeping (parent key, label) per state) and liveness needs a distributed SCC
/ backward-reachability pass (as DiVinE's OWCTY/MAP) instead of ``liveness.py``;
(2) the hash partition must be a stable hash of a canonical byte encoding (not Python's
``hash``) once processes run different interpreters; (3) batches are compressed and
sent in chunks while the level runs (not once at its end) to overlap network and work;
(4) a lost worker loses its partition: checkpoints per level, or a restart of the run.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import time
from array import array
from collections.abc import Sequence
from typing import Any

from model_checks.explicit.explore import EdgePred, Graph, Label, Progress
from model_checks.explicit.graph import StateBound
from model_checks.explicit.partition import label_of, owner, run_worker, start_method, wait_for
from model_checks.explicit.verdicts import state_preds
from spec.common import Mutants
from spec.config import Config
from spec.state import canonical


def explore_parallel(
    c: Config,
    mutants: Mutants = frozenset(),
    *,
    workers: int = 2,
    symmetry: bool = True,
    stop_on: str | None = None,
    max_states: int = 2_000_000,
    progress: Progress | None = None,
    edge_props: Sequence[tuple[str, EdgePred]] = (),
    method: str | None = None,
) -> Graph:
    """``explore`` on ``workers`` processes: the same ``Graph`` (see the module's doc)."""
    if workers < 1:
        raise ValueError(f"workers={workers}: at least 1")
    t0 = time.perf_counter()
    ctx: Any = mp.get_context(method or start_method())
    n = workers
    inbox = [ctx.Queue() for _ in range(n)]
    ctrl = [ctx.Queue() for _ in range(n)]
    report = ctx.Queue()
    args = (c, mutants, symmetry, stop_on, tuple(edge_props))
    procs = [
        ctx.Process(target=run_worker, args=(k, n, args, inbox, ctrl[k], report), daemon=True)
        for k in range(n)
    ]
    for p in procs:
        p.start()
    collect = gc.isenabled()
    gc.disable()  # unpickling the partitions and the replay allocate only acyclic tuples
    try:
        total = 0
        while True:  # one round per BFS level (the first: the initial state's owner)
            reports = [wait_for(report, procs) for _ in range(n)]
            new = sum(int(r[2]) for r in reports)
            total += new
            stop = any(bool(r[3]) for r in reports)
            if progress is not None:
                progress(total, new)
            if stop or new == 0:
                break
            if total > max_states:
                raise StateBound(c.name, max_states, None)
            for q in ctrl:
                q.put("expand")
        for q in ctrl:
            q.put("finish")
        parts: list[dict[str, Any]] = [{} for _ in range(n)]
        for _ in range(n):
            _, k, res = wait_for(report, procs)
            parts[k] = res
        for p in procs:
            p.join()
        init = canonical(c.initial()) if symmetry else c.initial()
        g = Graph(config=c, mutants=mutants, symmetry=symmetry)
        merge(g, parts, owner(init, n), stop_on, [pid for pid, _ in edge_props])
    finally:
        if collect:
            gc.enable()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    g.seconds = time.perf_counter() - t0
    return g


def merge(
    g: Graph,
    parts: list[dict[str, Any]],
    root: int,
    stop_on: str | None,
    edge_order: Sequence[str] = (),
) -> Graph:
    """Replay the serial BFS over the workers' edges: the serial explorer's ids and arrays."""
    n = len(parts)
    stop_states: set[int] = set()
    stop_edges: set[tuple[int, int]] = set()
    if stop_on is not None:
        for k, part in enumerate(parts):
            for pid, items in part["sv"].items():
                if pid == stop_on or stop_on == "*":
                    stop_states.update(j * n + k for j in items)
            for key in ("tv", "ev"):
                for pid, pairs in part[key].items():
                    if pid == stop_on or stop_on == "*":
                        stop_edges.update((j * n + k, seq) for j, seq in pairs)
    new_id = [array("q", [-1]) * len(part["states"]) for part in parts]
    labels: dict[int, Label] = {}
    states, depth, parent, plabel = g.states, g.depth, g.parent, g.parent_label
    src, dst, lab, first_edge = g.src, g.dst, g.lab, g.first_edge
    origin = [root]
    new_id[root][0] = 0
    states.append(parts[root]["states"][0])
    depth.append(0)
    parent.append(0)
    plabel.append(("", 0, 0))
    stopped = stop_on is not None and root in stop_states
    head = 0
    while head < len(states) and not stopped:
        sid = head
        head += 1
        j, k = divmod(origin[sid], n)
        off = parts[k]["off"]
        if j + 1 >= len(off):
            break  # not expanded: the level where the workers stopped
        first_edge.append(len(src))
        start, to, lab_of = off[j], parts[k]["to"], parts[k]["lab"]
        d1 = depth[sid] + 1
        for x in range(start, off[j + 1]):
            key = to[x]
            tl, tk = divmod(key, n)
            code = lab_of[x]
            lb = labels.get(code)
            if lb is None:
                lb = labels[code] = label_of(code)
            tid = new_id[tk][tl]
            if tid < 0:
                tid = new_id[tk][tl] = len(states)
                states.append(parts[tk]["states"][tl])
                depth.append(d1)
                parent.append(sid)
                plabel.append(lb)
                origin.append(key)
                stopped = stopped or key in stop_states
            src.append(sid)
            dst.append(tid)
            lab.append(lb)
            if stop_edges and (origin[sid], x - start) in stop_edges:
                stopped = True
            if stopped:
                break
    _violations(g, parts, new_id)
    if stopped:
        new_last = len(states) - 1 if not src or dst[-1] == len(states) - 1 else None
        _trim(g, stop_on, new_last, edge_order)
    return g


def _violations(g: Graph, parts: list[dict[str, Any]], new_id: list[array[int]]) -> None:
    """The shallowest violation of each property, as the serial explorer records it."""
    n_edges = len(g.src)

    def edge_index(k: int, j: int, seq: int) -> int:
        sid = new_id[k][j]
        if sid < 0 or sid >= len(g.first_edge):
            return -1
        x = g.first_edge[sid] + seq
        return x if x < n_edges else -1

    for k, part in enumerate(parts):
        for pid, items in part["sv"].items():
            for j in items:
                sid = new_id[k][j]
                if sid >= 0 and sid < g.first_violation.get(pid, len(g.states)):
                    g.first_violation[pid] = sid
        for pid, pairs in part["tv"].items():
            for j, seq in pairs:
                x = edge_index(k, j, seq)
                if x >= 0 and x < g.first_step_violation.get(pid, n_edges):
                    g.first_step_violation[pid] = x
        for pid, pairs in part["ev"].items():
            for j, seq in pairs:
                x = edge_index(k, j, seq)
                old = g.first_edge_violation.get(pid)
                if x >= 0 and (old is None or x < old[2]):
                    g.first_edge_violation[pid] = (g.src[x], g.lab[x], x)


def _trim(g: Graph, stop_on: str | None, new_last: int | None, edge_order: Sequence[str]) -> None:
    """At the edge where it stops, the serial explorer records the step violations, then
    the new state's violations in ``SAFETY`` order up to the first it stops on, then (if
    that did not stop it) the edge properties in their order up to the first it stops on;
    the workers checked everything on that level: drop what the serial explorer never saw."""

    def cut(pids: list[str], order: list[str]) -> tuple[list[str], bool]:
        pids.sort(key=order.index)
        k = next((x for x, pid in enumerate(pids) if pid == stop_on or stop_on == "*"), None)
        return (pids, False) if k is None else (pids[k + 1 :], True)

    state_stop = False
    if new_last is not None:
        here = [pid for pid, sid in g.first_violation.items() if sid == new_last]
        drop, state_stop = cut(here, [pid for pid, _ in state_preds(g.config)])
        for pid in drop:
            del g.first_violation[pid]
    last = len(g.src) - 1
    here = [pid for pid, v in g.first_edge_violation.items() if v[2] == last]
    drop, _ = (here, True) if state_stop else cut(here, list(edge_order))
    for pid in drop:
        del g.first_edge_violation[pid]


__all__ = ["explore_parallel", "merge"]
