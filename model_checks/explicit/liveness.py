"""Liveness on the explored graph (never a second exploration).

Everything runs on the explorer's own arrays (``Graph.src/dst/lab/first_edge``): a
networkx.DiGraph of a 150k-state graph costs more to build than the checks themselves,
so it is built only on demand (``Graph.to_networkx``, for DOT export and callers).

- ``NoDeadlock``: every reachable state is an ancestor of (or is) a quiescent terminal
  state: reverse reachability from the terminal states over every edge; and the same
  without the client's edges: a cancel is never the only way out of a wedge.
- ``FairTermination``: (1) in the subgraph of protocol actions only (``local`` and
  ``recv``: no fault, no timeout, no cancel), every state reachable from the initial
  state can still reach a quiescent terminal state in that subgraph; (2) the same with
  client cancels added: cancellation needs no timeout; (3) every non-trivial SCC
  (``networkx.strongly_connected_components``) has an exit that weak fairness forces:
  a protocol action enabled in all of its states with an edge leaving it. SCCs come
  from an iterative Tarjan over the out-edge arrays; of the SCCs without such an exit,
  the one holding the shallowest state is reported.
- ``RecoverWithoutTimeout``: in the subgraph of protocol actions plus the faults that
  lose nothing (duplicate, corrupt, mismatch, store failure; no loss, no crash, no
  timeout, no cancel), every state reachable from the initial state can still reach a
  quiescent terminal state in that subgraph: a detected fault is recovered by the
  protocol's own word (a Nack, a new epoch), never by waiting a timeout out.
- ``ReleaseWhileRunning``: once decode has committed a running request (reached with
  nothing lost: a lost Ack strands the source until a timeout), prefill's source can
  be freed while the request still runs (protocol actions, decode's finish excluded):
  the Ack is sent and used.
- ``BoundedExit``: each worker that waits on a peer can free what it holds through its
  own ``local`` steps and ``timeout`` actions alone (reverse reachability in that
  worker's subgraph): the exit does not depend on the peer being alive. On a transport
  with no revoke, the completion of a write in flight (``DecodeReceiveChunk``) counts
  too, and for decode the writer's timeouts: decode cannot stop a writer, it outwaits it.

Each check returns a shallowest offending state (or None) and the path to it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from model_checks.explicit.explore import Graph, Label
from spec.actions import ACTIONS
from spec.behaviours.async_steps import DISPATCHES
from spec.properties import decode_waiting, prefill_waiting, quiescent_terminal
from spec.state import NONE, RUNNING, WRITABLE, World

# faults that lose something (a message, a worker): recovery from them may need a timeout
LOSSY = frozenset({"EnvLose", "EnvCrash"})


def _cat(name: str) -> tuple[str, str]:
    a = ACTIONS[name]
    return a.actor, ("loss" if name in LOSSY else a.kind)


# one bit per (actor, kind) category of action, to filter edges cheaply (the lossy
# faults are a kind of their own, "loss")
_CATS = sorted({_cat(n) for n in ACTIONS})
_BIT = {cat: 1 << k for k, cat in enumerate(_CATS)}
_ACTION_BIT = {name: _BIT[_cat(name)] for name in ACTIONS}
_DECODE_FINISH = 1 << len(_CATS)  # an extra bit: ReleaseWhileRunning leaves it out
_LANDS = 1 << (len(_CATS) + 1)  # an extra bit: a one-sided write completes (the transport's)


def mask(pred: Callable[[str, str], bool]) -> int:
    return sum(bit for (actor, kind), bit in _BIT.items() if pred(actor, kind))


PROTOCOL = mask(lambda a, k: k in ("local", "recv"))
PROTOCOL_CLIENT = mask(lambda a, k: k in ("local", "recv", "client"))
RECOVER = mask(lambda a, k: k in ("local", "recv", "fault"))  # "fault": the non-lossy ones
NO_CLIENT = mask(lambda a, k: k != "client")


def _own_exit(actor: str) -> int:
    return mask(lambda a, k: a == actor and k in ("local", "timeout"))


OWN_EXIT = {x: _own_exit(x) for x in ("P", "D")}
# On a transport with no revoke (``Config.revocable`` False) a worker cannot stop a write
# in flight: its exit waits for the write to complete (the transport's step, not the
# peer's), and decode's also for the writer's own timeout (spec/behaviours/irrevocable.py).
OWN_EXIT_UNREVOCABLE = {"P": OWN_EXIT["P"] | _LANDS, "D": OWN_EXIT["D"] | _LANDS | _own_exit("P")}


@dataclass
class LiveResult:
    prop: str
    holds: bool
    state: int | None = None  # a shallowest offending state
    path: list[Label] | None = None  # the labels from the initial state to it
    note: str = ""


class _Edges:
    """Per-edge category bits, reverse adjacency and the goal states, built once per graph."""

    def __init__(self, gr: Graph) -> None:
        self.bits = [
            _ACTION_BIT[lb[0]]
            | (_DECODE_FINISH if lb[0] == "DecodeFinish" else 0)
            | (_LANDS if lb[0] == "DecodeReceiveChunk" else 0)
            for lb in gr.lab
        ]
        rev: list[list[int]] = [[] for _ in range(gr.n_states)]
        for idx, d in enumerate(gr.dst):
            rev[d].append(idx)
        self.rev = rev
        c = gr.config
        self.goals = [i for i, w in enumerate(gr.states) if quiescent_terminal(w, c)]


ALL = mask(lambda a, k: True)


def _reach_back(
    gr: Graph, ed: _Edges, targets: Iterable[int], m: int, without: int = 0
) -> set[int]:
    """Targets plus every state that reaches one through edges in category mask ``m``
    (and with none of the bits of ``without``)."""
    seen = set(targets)
    queue = deque(seen)
    src, bits, rev = gr.src, ed.bits, ed.rev
    while queue:
        n = queue.popleft()
        for idx in rev[n]:
            if bits[idx] & m and not bits[idx] & without:
                p = src[idx]
                if p not in seen:
                    seen.add(p)
                    queue.append(p)
    return seen


def _reach_fwd(gr: Graph, ed: _Edges, m: int) -> dict[int, tuple[int, Label]]:
    """Shortest-path parents from the initial state through edges in mask ``m``."""
    par: dict[int, tuple[int, Label]] = {0: (0, ("", 0, 0))}
    queue = deque([0])
    bits, dst, lab, out_edges = ed.bits, gr.dst, gr.lab, gr.out_edges
    while queue:
        n = queue.popleft()
        for idx in out_edges(n):
            if bits[idx] & m:
                t = dst[idx]
                if t not in par:
                    par[t] = (n, lab[idx])
                    queue.append(t)
    return par


def _walk(par: dict[int, tuple[int, Label]], sid: int) -> list[Label]:
    out: list[Label] = []
    while sid != 0:
        sid, lb = par[sid]
        out.append(lb)
    out.reverse()
    return out


def _shallowest(gr: Graph, bad: Iterable[int]) -> int | None:
    return min(bad, key=lambda s: (gr.depth[s], s), default=None)


def no_deadlock(gr: Graph, ed: _Edges) -> LiveResult:
    ok = _reach_back(gr, ed, ed.goals, ALL)
    bad = _shallowest(gr, (s for s in range(gr.n_states) if s not in ok))
    if bad is not None:
        sink = len(gr.out_edges(bad)) == 0
        note = "a non-terminal sink" if sink else "no quiescent terminal state is reachable"
        return LiveResult("NoDeadlock", False, bad, gr.path_to(bad), note)
    ok = _reach_back(gr, ed, ed.goals, NO_CLIENT)
    bad = _shallowest(gr, (s for s in range(gr.n_states) if s not in ok))
    if bad is None:
        return LiveResult("NoDeadlock", True)
    note = "only a client cancel leads to a quiescent terminal state"
    return LiveResult("NoDeadlock", False, bad, gr.path_to(bad), note)


def recover_without_timeout(gr: Graph, ed: _Edges) -> LiveResult:
    res = _terminates_within(
        gr, ed, RECOVER, "a detected fault that only a timeout, cancel or loss ends"
    )
    if res is None:
        return LiveResult("RecoverWithoutTimeout", True)
    return LiveResult("RecoverWithoutTimeout", False, res.state, res.path, res.note)


def _source_held_after_commit(w: World) -> bool:
    return any(r.st == RUNNING and r.d == WRITABLE and r.p != NONE for r in w.reqs)


def release_while_running(gr: Graph, ed: _Edges) -> LiveResult:
    flags = [_source_held_after_commit(w) for w in gr.states]
    free = (i for i, f in enumerate(flags) if not f)
    ok = _reach_back(gr, ed, free, PROTOCOL, without=_DECODE_FINISH)
    par = _reach_fwd(gr, ed, RECOVER)  # nothing lost: a lost Ack may strand the source
    bad = [s for s in par if flags[s] and s not in ok]
    if not bad:
        return LiveResult("ReleaseWhileRunning", True)
    worst = min(bad, key=lambda s: (len(_walk(par, s)), s))
    note = "decode committed, but the source stays held until the request ends"
    return LiveResult("ReleaseWhileRunning", False, worst, _walk(par, worst), note)


def _terminates_within(gr: Graph, ed: _Edges, m: int, what: str) -> LiveResult | None:
    par = _reach_fwd(gr, ed, m)
    goal = [s for s in ed.goals if s in par]
    ok = _reach_back(gr, ed, goal, m)
    bad = [s for s in par if s not in ok]
    if not bad:
        return None
    worst = min(bad, key=lambda s: (len(_walk(par, s)), s))
    return LiveResult("FairTermination", False, worst, _walk(par, worst), what)


def sccs(gr: Graph, skip: frozenset[str] = frozenset()) -> list[list[int]]:
    """The strongly connected components of the explored graph that hold a cycle (two
    or more states, or one state with a self-loop): iterative Tarjan on the arrays.
    Edges of the actions named in ``skip`` are left out."""
    n = gr.n_states
    dst, fe, n_edges = gr.dst, gr.first_edge, gr.n_edges
    if skip:  # a left-out edge points to a state that is never on the stack (-1)
        dst = [-1 if lb[0] in skip else d for d, lb in zip(dst, gr.lab, strict=True)]
    ends = [*fe[1:], n_edges] if fe else []
    ends.extend([0] * (n - len(ends)))
    starts = [*fe, *([0] * (n - len(fe)))]
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] != -1:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        work = [(root, starts[root])]
        while work:
            v, e = work[-1]
            end = ends[v]
            pushed = False
            while e < end:
                t = dst[e]
                e += 1
                if t < 0:
                    continue
                if index[t] == -1:
                    work[-1] = (v, e)
                    index[t] = low[t] = counter
                    counter += 1
                    stack.append(t)
                    on_stack[t] = True
                    work.append((t, starts[t]))
                    pushed = True
                    break
                if on_stack[t] and index[t] < low[v]:
                    low[v] = index[t]
            if pushed:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                if low[v] < low[u]:
                    low[u] = low[v]
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack[x] = False
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1 or v in dst[starts[v] : ends[v]]:
                    out.append(comp)
    return out


def _fair_sccs(gr: Graph, ed: _Edges) -> LiveResult | None:
    worst: int | None = None
    # finite output: a request dispatches finitely many async steps (the cycle of
    # dispatch and completion is the async form of DecodeStep's self-loop)
    for comp in sccs(gr, DISPATCHES if gr.config.async_steps else frozenset()):
        # a protocol action enabled in every state of the SCC, with an edge leaving it,
        # is forced by weak fairness: then no fair run stays in the SCC forever
        members = set(comp)
        common: set[Label] | None = None
        leaving: set[Label] = set()
        for n in comp:
            labs: set[Label] = set()
            for idx in gr.out_edges(n):
                if ed.bits[idx] & PROTOCOL:
                    labs.add(gr.lab[idx])
                    if gr.dst[idx] not in members:
                        leaving.add(gr.lab[idx])
            common = labs if common is None else common & labs
        if not (common or set()) & leaving:
            bad = _shallowest(gr, comp)
            if bad is not None and (
                worst is None or (gr.depth[bad], bad) < (gr.depth[worst], worst)
            ):
                worst = bad
    if worst is None:
        return None
    return LiveResult(
        "FairTermination", False, worst, gr.path_to(worst), "a fair cycle avoids progress"
    )


def fair_termination(gr: Graph, ed: _Edges) -> LiveResult:
    for res in (
        _terminates_within(gr, ed, PROTOCOL, "stuck without faults, cancels or timeouts"),
        _terminates_within(gr, ed, PROTOCOL_CLIENT, "a cancel that needs a timeout to end"),
        _fair_sccs(gr, ed),
    ):
        if res is not None:
            return res
    return LiveResult("FairTermination", True)


def bounded_exit(gr: Graph, ed: _Edges) -> LiveResult:
    c = gr.config
    worst: int | None = None
    note = ""
    exits = OWN_EXIT if c.revocable else OWN_EXIT_UNREVOCABLE
    for actor, waiting in (("D", decode_waiting), ("P", prefill_waiting)):
        flags = [waiting(w, c) for w in gr.states]
        ok = _reach_back(gr, ed, (i for i, f in enumerate(flags) if not f), exits[actor])
        bad = _shallowest(gr, (i for i, f in enumerate(flags) if f and i not in ok))
        if bad is not None and (worst is None or gr.depth[bad] < gr.depth[worst]):
            worst, note = bad, f"{actor} waits with no exit of its own"
    if worst is None:
        return LiveResult("BoundedExit", True)
    return LiveResult("BoundedExit", False, worst, gr.path_to(worst), note)


CHECKS: dict[str, Callable[[Graph, _Edges], LiveResult]] = {
    "NoDeadlock": no_deadlock,
    "FairTermination": fair_termination,
    "BoundedExit": bounded_exit,
    "RecoverWithoutTimeout": recover_without_timeout,
    "ReleaseWhileRunning": release_while_running,
}


def check_liveness(gr: Graph, only: Iterable[str] | None = None) -> list[LiveResult]:
    """Run the liveness checks (all, or ``only`` those IDs) on an explored graph."""
    ed = _Edges(gr)
    names = list(CHECKS) if only is None else [n for n in CHECKS if n in set(only)]
    return [CHECKS[n](gr, ed) for n in names]
