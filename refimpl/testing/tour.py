"""The graph tour (issue #27): drive the implementation through the spec's explored graph.

The random walk of the machine finds what is shallow and common; the explorer
(``model_checks.explicit.explore``) already knows every reachable abstract state and
every edge. ``plan_tour`` turns that graph into a few short action sequences from the
initial state that together cover a goal:

    edges   every edge of the graph (``coverage.edge_key``: symmetric requests are one
            edge), by greedy walks: from where the walk stands, take an uncovered edge,
            else the BFS-shortest way to the nearest state that has one; a walk ends at
            ``MAX_LEN`` steps or where nothing uncovered is reachable, and the next starts
            over from the initial state. For the small worlds (``EDGE_TOURS``).
    pairs   every reachable (action, outcome) pair: "ok", "refused:<property>" and
            "refused" (not enabled), each at the shallowest state that offers it (its
            enabled edges, and the refusal probes of ``probes.spec_refusals``), by the
            BFS-tree path there; paths that are a prefix of another are dropped.

``run_tour`` replays every sequence on a fresh instance with the machine's own checks
(``harness.Harness``: the refinement map after every step, every safety property,
integrity, the bytes and the content ghost), the refusal probes on every abstract state
the tour reaches (once per state), and the drain to quiescence at the end
(``drain.drain``). It stops at the first ``Divergence``. ``tour_kill`` is the
deterministic first judge of a bug switch (``run.kill``); ``report`` is the coverage
report (``kvown fuzz --tour``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from model_checks.explicit.explore import Graph, Label, explore
from model_checks.explicit.trace import concretize
from refimpl.testing.coverage import EdgeKey, edge_key
from refimpl.testing.drain import drain
from refimpl.testing.harness import Adapter, Coverage, Divergence, Harness, Step
from refimpl.testing.probes import refusal_probes, spec_refusals
from spec.config import Config
from spec.state import World

__all__ = [
    "EDGE_TOURS",
    "KILL_WORLDS",
    "TourPlan",
    "TourResult",
    "graph_of",
    "plan_tour",
    "report",
    "run_tour",
    "tour_kill",
]

EDGE_TOURS = ("handoff_crash", "offload_contend", "offload_crash")  # toured edge by edge
MAX_LEN = 60  # steps of a greedy walk before the next starts over
Pair = tuple[str, str]  # (action, outcome): "ok", "refused:<property>", "refused"

_GRAPHS: dict[str, Graph] = {}
_PLANS: dict[tuple[str, str, int | None], TourPlan] = {}


def graph_of(c: Config) -> Graph:
    """The correct spec's explored graph of ``c`` (kept for the process: a kill matrix
    tours the same world once per switch)."""
    g = _GRAPHS.get(c.name)
    if g is None or g.config != c:
        g = _GRAPHS[c.name] = explore(c)
    return g


def _outcome(prop: str | None) -> str:
    return "refused" + (f":{prop}" if prop else "")


def state_pairs(g: Graph, sid: int) -> set[Pair]:
    """The (action, outcome) pairs that state ``sid`` offers."""
    out = {(g.lab[e][0], "ok") for e in g.out_edges(sid)}
    out.update((n, _outcome(p)) for n, _, _, p in spec_refusals(g.states[sid], g.config))
    return out


def first_pairs(
    g: Graph, scan: int | None = None, refusals: Any = spec_refusals
) -> dict[Pair, tuple[int, int | None]]:
    """Each reachable pair, with the shallowest state that offers it (and, for "ok", the
    edge), in BFS order, the first ``scan`` states (None: all); ``refusals(w, c)``: a
    state's probes (``on_api.pairs``: the API's, on its ``ClosedGraph``)."""
    found: dict[Pair, tuple[int, int | None]] = {}
    for sid in range(g.n_states if scan is None else min(scan, g.n_states)):
        for e in g.out_edges(sid):
            found.setdefault((g.lab[e][0], "ok"), (sid, e))
        for n, _, _, p in refusals(g.states[sid], g.config):
            found.setdefault((n, _outcome(p)), (sid, None))
    return found


def graph_edge_keys(g: Graph) -> list[EdgeKey]:
    """``edge_key`` of every edge of ``g`` (by edge index)."""
    out = []
    for e in range(g.n_edges):
        name, i, arg = g.lab[e]
        out.append(edge_key(g.states[g.src[e]], name, i, arg))
    return out


def _edge_cover(g: Graph, keys: list[EdgeKey], max_len: int) -> list[list[int]]:
    """Greedy walks (edge indices) that together take every key (see the module doc)."""
    rep: dict[EdgeKey, int] = {}
    kid = [rep.setdefault(k, len(rep)) for k in keys]
    covered = bytearray(len(rep))
    todo = [0] * g.n_states  # uncovered keys among a state's out-edges
    seen_at: set[int] = set()
    for e in range(g.n_edges):
        if kid[e] not in seen_at:
            seen_at.add(kid[e])
            todo[g.src[e]] += 1
    left = len(rep)

    def take(e: int) -> None:
        nonlocal left
        if not covered[kid[e]]:
            covered[kid[e]] = 1
            todo[g.src[e]] -= 1
            left -= 1

    # each state's (edge, target) list, and a BFS's visited marks by stamp: the same search
    # as a dict of parents per call and g.out_edges per visit, without rebuilding them
    # (the walk's searches were most of a plan's CPU: 44 of 71 s on retract_fail_one)
    outs = [[(e, g.dst[e]) for e in g.out_edges(s)] for s in range(g.n_states)]
    mark = [0] * g.n_states
    back = [-1] * g.n_states
    stamp = 0

    def way(start: int) -> list[int] | None:  # BFS: edges to the nearest state with todo
        nonlocal stamp
        if todo[start]:
            return []
        stamp += 1
        mark[start] = stamp
        q = deque([start])
        while q:
            s = q.popleft()
            for e, d in outs[s]:
                if mark[d] == stamp:
                    continue
                mark[d] = stamp
                back[d] = e
                if todo[d]:
                    path = []
                    while d != start:
                        path.append(back[d])
                        d = g.src[back[d]]
                    return path[::-1]
                q.append(d)
        return None

    walks: list[list[int]] = []
    while left:
        cur, walk = 0, list[int]()
        while left:
            path = way(cur)
            if path is None or (walk and len(walk) + len(path) >= max_len):
                break
            at = g.dst[path[-1]] if path else cur
            # an uncovered edge into uncovered work first; one into a dead end last
            nxt = max(
                (e for e in g.out_edges(at) if not covered[kid[e]]),
                key=lambda e: (todo[g.dst[e]] > (g.dst[e] == at), todo[g.dst[e]]),
            )
            for e in (*path, nxt):
                take(e)
            walk += [*path, nxt]
            cur = g.dst[nxt]
            if len(walk) >= max_len:
                break
        walks.append(walk)
    return walks


def _without_prefixes(paths: list[list[Label]]) -> list[list[Label]]:
    kept: list[list[Label]] = []
    for p in sorted(paths, key=len, reverse=True):
        if not any(k[: len(p)] == p for k in kept):
            kept.append(p)
    return kept


@dataclass
class TourPlan:
    config: Config
    goal: str  # "edges" or "pairs"
    sequences: list[list[Step]]  # concrete trace steps from the initial state
    states: int  # states of the graph
    edges: int  # its edges, symmetric requests merged (``edge_key``)
    edge_keys: frozenset[EdgeKey]
    pairs: frozenset[Pair]  # the reachable pairs found (all, unless ``scanned`` is bounded)
    scanned: int  # states scanned for pairs
    seconds: float  # CPU seconds to explore and plan

    @property
    def steps(self) -> int:
        return sum(len(s) for s in self.sequences)


def plan_tour(
    c: Config, goal: str | None = None, *, scan: int | None = None, max_len: int = MAX_LEN
) -> TourPlan:
    """The tour of ``c``: ``goal`` "edges" or "pairs" (default: edges for ``EDGE_TOURS``,
    pairs elsewhere); ``scan`` bounds the states scanned for pairs (None: every state)."""
    goal = goal or ("edges" if c.name in EDGE_TOURS else "pairs")
    if goal not in ("edges", "pairs"):
        raise ValueError(f"unknown tour goal {goal!r}; valid goals: edges, pairs")
    memo = _PLANS.get((c.name, goal, scan))
    if memo is not None and memo.config == c:
        return memo
    t0 = time.process_time()
    g = graph_of(c)
    keys = graph_edge_keys(g)
    found = first_pairs(g, scan)
    if goal == "edges":
        paths = [[g.lab[e] for e in walk] for walk in _edge_cover(g, keys, max_len)]
    else:
        paths = _without_prefixes(
            [g.path_to(s) if e is None else g.step_path(e) for s, e in found.values()]
        )
    scanned = g.n_states if scan is None else min(scan, g.n_states)
    plan = TourPlan(
        c,
        goal,
        [concretize(g, p) for p in paths],
        g.n_states,
        len(set(keys)),
        frozenset(keys),
        frozenset(found),
        scanned,
        time.process_time() - t0,
    )
    _PLANS[(c.name, goal, scan)] = plan
    return plan


@dataclass
class TourResult:
    config: str
    goal: str
    sequences: int = 0  # sequences run (to the first failure)
    steps: int = 0  # steps taken, the drains included
    probes: int = 0  # refusal probes offered
    coverage: Coverage = field(default_factory=lambda: Coverage(edges=set()))
    failure: Divergence | None = None
    seconds: float = 0.0  # CPU seconds

    @property
    def failed(self) -> bool:
        return self.failure is not None


def run_tour(
    adapter: Adapter,
    plan: TourPlan,
    mutants: Sequence[str] = (),
    *,
    seed: int = 0,
    limit: int | None = None,
    deadline: Any = None,
) -> TourResult:
    """Replay the first ``limit`` (None: every) sequences of ``plan`` with every check
    (see the module doc); stops at the first divergence, kept in ``failure``, or before
    a sequence once ``deadline`` (a ``run.Deadline``) passed."""
    res = TourResult(plan.config.name, plan.goal)
    t0 = time.process_time()
    probed: set[World] = set()

    def probe(h: Harness) -> None:
        if h.abs not in probed:
            probed.add(h.abs)
            got = refusal_probes(h)
            res.probes += len(got)
            h.probe_all(got)

    for seq in plan.sequences[:limit]:
        if deadline is not None and deadline.passed():
            break
        res.sequences += 1
        try:
            h = Harness(adapter, plan.config, frozenset(mutants), seed, res.coverage)
            h.check_state()
            probe(h)
            for st in seq:
                h.step(st["action"], st["args"])
                h.check_state()
                probe(h)
            res.steps += len(seq) + drain(h)
        except Divergence as err:
            res.failure = err
            break
    res.seconds = time.process_time() - t0
    return res


def report(plan: TourPlan, cov: Coverage, **extra: Any) -> dict[str, Any]:
    """The coverage report of one config: the graph's edges and reachable pairs, and how
    many of each ``cov`` exercised (a tour's or a fuzz run's)."""
    got_pairs = {p for p, n in cov.pairs.items() if n}
    edges = len(plan.edge_keys & cov.edges) if cov.edges is not None else None
    return {
        "config": plan.config.name,
        "goal": plan.goal,
        "states": plan.states,
        "edges": plan.edges,
        "edges_covered": edges,
        "pairs": len(plan.pairs),
        "pairs_covered": len(plan.pairs & got_pairs),
        "pairs_missed": sorted(f"{a} {o}" for a, o in plan.pairs - got_pairs),
        "pairs_scanned_states": plan.scanned,
        "sequences": len(plan.sequences),
        "planned_steps": plan.steps,
        **extra,
    }


# Where each bug switch is judged by the tour: the smallest world whose tour kills it (measured;
# tests/fuzz/test_tour_kills.py holds every entry); others: ``run.mutant_config``'s world.
KILL_WORLDS: dict[str, str] = {
    "release_before_install": "mismatch_one",
    "source_writes_while_frozen": "mismatch_one",
    "source_resumes_on_timeout": "mismatch_one",
    "partial_as_complete": "mismatch_one",
    "mismatch_installed": "mismatch_one",
    "cancel_ignored": "mismatch_one",
    "stale_epoch_accepted": "restart_handoff",
    "error_overwritten": "mismatch_one",
    "free_on_cancel_in_flight": "mismatch_one",
    "duplicate_rank_counted": "mismatch_one",
    "free_fenced_unrevocable": "unrevocable_one",
    "batch_status_subset": "unrevocable_one",
    "slot_reused_unfenced": "slots_one",
    "zero_block_never_done": "full_hit_one",
    "sweep_only_on_admit": "crash_both",
    "failed_store_visible": "offload_contend",
    "reload_during_store": "offload_contend",
    "preempt_during_store": "offload_contend",
    "evict_referenced_prefix": "identity_prefix",
    "free_with_step_in_flight": "async_handoff",
    "freeze_with_step_in_flight": "async_handoff",
    "preempt_with_step_in_flight": "async_handoff",
    "prefix_hash_unchecked": "identity_prefix",
    "unstaged_block_advertised": "identity_prefix",
    "validate_after_decode_failure": "retract_fail_one",
    "retract_loses_kv": "retract_fail_one",
    "retract_keeps_epoch": "retract_fail_one",
    "stale_incarnation_accepted": "restart_handoff",
    "restart_keeps_pool": "restart_handoff",
    "no_timeout_while_filling": "mismatch_one",
    "decode_runs_before_all_ranks": "ranks_one",
    # issue #22: the host cache's and the turns' switches, in their own small worlds
    "evict_pinned_copy": "host_cache_warm",
    "unpin_at_load_start": "host_cache_warm",
    "reload_consumes_shared": "host_cache_warm",
    "failed_load_counted_loaded": "host_cache_warm",
    "failed_load_keeps_hit": "host_cache_warm",
    "publish_before_commit": "host_cache_store",
    "late_completion_publishes": "host_cache_store",
    "append_after_evict": "turns_append",
    "append_divergent_uncut": "turns_append",
    "two_writers_on_session": "turns_append",
    "evict_pinned_session": "turns_append",
    # issue #30 item 2, streamed offers (spec/stream); #32 item 3, sliding windows (spec/window)
    "stream_reads_at_ready": "stream_one",
    "layer_ready_on_staging": "stream_one",
    "window_prunes_under_io": "window_prune",
}


def tour_kill(adapter: Adapter, name: str, world: str | None = None, deadline: Any = None) -> Any:
    """Judge switch ``name`` by the edge tour of ``world`` (default ``KILL_WORLDS``): a
    ``run.Kill`` (killed or not; its program is the failing sequence, shrunk); the tour
    and the shrink stop once ``deadline`` (a ``run.Deadline``) passed."""
    from refimpl.testing.run import NO_DEADLINE as NO
    from refimpl.testing.run import Kill, mutant_config, shrink_program
    from refimpl.testing.worlds import get_world

    cname = world or KILL_WORLDS.get(name) or mutant_config(name)
    if not adapter.switches().get(name, False):
        return Kill(name, cname, False, None, message="not applicable here", by="tour")
    c = get_world(cname)
    t0 = time.process_time()
    res = run_tour(adapter, plan_tour(c, "edges"), (name,), deadline=deadline)
    if res.failure is None:
        took = time.process_time() - t0
        return Kill(name, cname, True, False, seconds=took, by="tour")
    prog, err = shrink_program(adapter, c, (name,), 0, res.failure.program, deadline or NO)
    first = str(err).splitlines()[0]
    caught = f"{err.kind}: {prog[-1]['action']}" if prog else err.kind
    took = time.process_time() - t0
    return Kill(
        name, cname, True, True, len(prog), res.sequences, took, first, prog, 0, caught, by="tour"
    )
