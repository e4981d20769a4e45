"""The graph tour on the public API (issue #30): every edge, on real Senders/Receivers.

The API takes some spec steps inside one call (``EAGER``): a Sender sends every chunk
and every seal on Ready (``PrefillSendChunk``); a Receiver that has every layer and seal
verifies and commits at once (``DecodeValidate``, ``DecodeCommit``), and gives up an
attempt whose chunk failed its checksum, or that the engine failed (``Receiver.fail``:
``DecodeFail``), at once (``DecodeAbort`` of an invalid attempt,
of a running request or of one the scheduler has ended); an offload's or a reload's
Sender (``refimpl.api.offload.begin_offload``/``begin_reload``) sends every block on the
ready (``PrefillOffloadCopy``, ``PrefillReloadCopy``). So the API refines the
spec *closed* under them: ``close(w)`` takes those steps while one is enabled, in a
fixed order, and the API's states are the closed ones. ``closed_graph`` explores that
system from the spec (every edge: a non-eager spec step, then the closure); states the
API passes through inside a call are not toured (``ApiPlan.spec_edges`` says how many of
the spec's own edges there are, for the report).

``run_api_tour`` replays greedy walks covering every closed edge (``tour._edge_cover``)
on ``api_adapter.ApiAdapter`` with the harness's checks after every step (the
refinement map, every safety property, integrity, the Receiver's layers, the content
ghost), the refusal probes the API can judge (``api_probes``), and the drain; unlike
``tour.run_tour`` it goes on past a divergence (each walk is independent), so that the
report lists every place where the API leaves the spec.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from model_checks.explicit.explore import explore
from refimpl.testing.coverage import Coverage, EdgeKey, edge_key
from refimpl.testing.drain import drain
from refimpl.testing.harness import NO_MUTANTS, Adapter, Divergence, Harness
from refimpl.testing.on_api.early import early_aborts, early_nacks
from refimpl.testing.probes import MSG_ACTIONS, refusal_probes
from refimpl.testing.tour import _edge_cover
from spec.actions import apply, decode_args, encode_args, successors
from spec.common import Refused
from spec.config import Config
from spec.state import (
    DF_CORRUPT,
    DF_FAILED,
    DF_MISMATCH,
    FILLING,
    M_HANDOFF,
    M_HANDOFF_BAD,
    RESERVED,
    World,
    msg_epoch,
    msg_kind,
)

__all__ = [
    "EAGER",
    "ApiHarness",
    "ApiPlan",
    "close",
    "closed_graph",
    "declined",
    "judged",
    "plan_api",
    "run_api_tour",
]

EAGER = (
    "PrefillSendChunk",
    "DecodeValidate",
    "DecodeRankInstall",
    "DecodeCommit",
    "DecodeAbort",
    "DecodeInstallLayer",
    "PrefillOffloadCopy",  # an offload's / a reload's Sender sends every block on the ready
    "PrefillReloadCopy",
    # the shared host cache (on_api/worlds/host_cache.py): a store's HostStoreBegin writes
    # its temp file before it returns, a cancel joins the writer (its late completion), a
    # DiskTier unlinks an unpublished copy at its last reader's close
    "HostStoreCopy",
    "HostLateComplete",
    "HostFree",
)
MAX_LEN = 60
JUDGED = frozenset({"PrefillDecodeStep"})  # non-message probes the API adapter judges
# ... and those it judges where the world has the feature (elsewhere a refusal of every
# kind would add one probe pair to every world): the scheduler's preemption reads a
# store's pins (on_api/worlds/recompute.py)
JUDGED_WITH = {
    "PrefillPreempt": "recompute",
    "HostLookup": "host_cache",  # a miss: PublishAfterCommit
    "HostLoadBegin": "host_cache",  # no room: CapacityRefcount, the lookup kept
    # the decode engine's eviction reads the prefix's references (on_api/worlds/prefix.py)
    "DecodeEvictPrefix": "prefix",
}


def judged(name: str, c: Config) -> bool:
    """Whether the API adapter judges the spec's refusals of non-message action ``name``."""
    return name in JUDGED or (name in JUDGED_WITH and bool(getattr(c, JUDGED_WITH[name])))


def _eager(w: World, c: Config, name: str, i: int) -> World | None:
    r = w.reqs[i]
    if name == "DecodeAbort":  # only the receiver's own verdict on an invalid attempt
        bad = r.dfl & (DF_CORRUPT | DF_MISMATCH | DF_FAILED)  # (of an ended request too)
        if not (r.d in (RESERVED, FILLING) and bad):
            return None
        if declined(w, c, name, i, 0):  # an ended request's, a write may land: fenced
            name = "DecodeAbortFenced"
    s = apply(w, c, NO_MUTANTS, name, i, 0)
    return s if isinstance(s, World) else None


def declined(w: World, c: Config, name: str, i: int, arg: int) -> bool:
    """A spec step the API never takes because it takes the spec's alternative instead (a
    refinement may choose): it refuses an incompatible manifest at intake (``DecodeReject``,
    not ``DecodeReserve`` and a refusal at validation), and gives up an ended request's
    attempt on its revocable transport by fencing it (``DecodeAbortFenced``, not
    ``DecodeAbort``'s quarantine). On an unrevocable one (``Config.revocable=False``)
    ``DecodeAbortFenced`` is never enabled, so nothing is declined: the Receiver takes
    ``DecodeAbort``'s quarantine until the writer's Quiesced (``refimpl.api.unrevocable``).
    The alternative is enabled wherever the step declined is, so declining one never
    leaves the API stuck where the spec can go on.

    One step is declined with no alternative but to wait: ``DecodeEvictPrefix`` while a
    Handoff that decode has not taken is in flight. An API offer names the prefix blocks
    it does not send (``offer(prefix_blocks=)``, from decode's answer at the freeze, as
    vLLM's ``get_num_new_matched_tokens``), where the spec's decode counts its hit only
    at ``DecodeReserve``; decode's scheduler keeps what it said it holds until the
    manifest is taken (``on_api/worlds/prefix.py``). Eviction is enabled again once it
    is, so nothing is left stuck; the spec's states after an eviction under a Handoff
    in flight (a full send where the offer counted the prefix) are not toured."""
    if name == "DecodeReserve":
        return msg_kind(arg) == M_HANDOFF_BAD
    if name == "DecodeEvictPrefix":
        return w.pfx and any(
            msg_kind(x) in (M_HANDOFF, M_HANDOFF_BAD) and msg_epoch(x) > r.dep
            for r in w.reqs
            for x in r.net
        )
    if name == "DecodeAbort":
        return isinstance(apply(w, c, NO_MUTANTS, "DecodeAbortFenced", i, 0), World)
    return False


def close(w: World, c: Config) -> World:
    """``w`` after every step the API takes inside the call that reached it."""
    for _ in range(1000):
        for name in EAGER:
            nxt = next((s for i in range(len(w.reqs)) if (s := _eager(w, c, name, i))), None)
            if nxt is not None:
                w = nxt
                break
        else:
            return w
    raise RuntimeError(f"{c.name}: the eager closure does not end")


class ApiHarness(Harness):
    """The harness whose oracle is the spec closed under ``EAGER``."""

    def verdict(self, name: str, i: int, arg: int) -> World | Refused:
        got = super().verdict(name, i, arg)
        return close(got, self.c) if isinstance(got, World) else got


@dataclass
class ClosedGraph:
    """The closed system's graph, in the shape ``tour._edge_cover`` walks."""

    config: Config
    states: list[World] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    lab: list[tuple[str, int, int]] = field(default_factory=list)
    out: list[list[int]] = field(default_factory=list)

    @property
    def n_states(self) -> int:
        return len(self.states)

    @property
    def n_edges(self) -> int:
        return len(self.src)

    def out_edges(self, sid: int) -> list[int]:
        return self.out[sid]


def closed_graph(c: Config, max_states: int = 200_000) -> ClosedGraph:
    """Breadth-first over the closed system (exact states: no symmetry reduction)."""
    g = ClosedGraph(c)
    start = close(c.initial(), c)
    ids = {start: 0}
    g.states.append(start)
    g.out.append([])
    q = deque([start])
    while q:
        w = q.popleft()
        sid = ids[w]
        for name, i, arg, s in successors(w, c, NO_MUTANTS):
            if declined(w, c, name, i, arg):
                continue
            t = close(s, c)
            tid = ids.get(t)
            if tid is None:
                if len(ids) >= max_states:
                    raise RuntimeError(f"{c.name}: more than {max_states} closed states")
                tid = ids[t] = len(g.states)
                g.states.append(t)
                g.out.append([])
                q.append(t)
            g.out[sid].append(len(g.src))
            g.src.append(sid)
            g.dst.append(tid)
            g.lab.append((name, i, arg))
    return g


@dataclass
class ApiPlan:
    config: Config
    sequences: list[list[dict[str, Any]]]
    states: int  # closed states
    edge_keys: frozenset[EdgeKey]  # closed edges (``edge_key``)
    spec_states: int  # the spec's own graph, for the report
    spec_edges: int
    seconds: float
    goal: str = "edges"  # or "pairs" (``on_api.pairs``)
    pairs: frozenset[tuple[str, str]] = frozenset()  # the closed system's pairs, for "pairs"


_PLANS: dict[str, ApiPlan] = {}


def plan_api(c: Config) -> ApiPlan:
    memo = _PLANS.get(c.name)
    if memo is not None and memo.config == c:
        return memo
    t0 = time.process_time()
    g = closed_graph(c)
    keys = [edge_key(g.states[g.src[e]], *g.lab[e]) for e in range(g.n_edges)]
    # every concrete edge planned (no symmetry here: edge_key merges symmetric requests,
    # which a walk over exact states must not, or a state's count of keys left is wrong)
    walks = _edge_cover(g, [(e,) for e in range(g.n_edges)], MAX_LEN)  # type: ignore[arg-type,misc]
    seqs = [
        [{"action": g.lab[e][0], "args": encode_args(*g.lab[e])} for e in walk] for walk in walks
    ]
    spec = explore(c)
    plan = ApiPlan(
        c, seqs, g.n_states, frozenset(keys), spec.n_states, spec.n_edges, time.process_time() - t0
    )
    _PLANS[c.name] = plan
    return plan


def api_probes(h: Harness) -> tuple[list[tuple[str, dict[str, Any], str | None]], int]:
    """The refusal probes the API can judge, and how many others were left out: a message
    not in flight (the transport has none to deliver), and ``JUDGED`` actions. Which
    message action consumes a message in flight is the end's own choice on delivery."""
    kept, left = [], 0
    for name, args, prop in refusal_probes(h):
        if name in MSG_ACTIONS:
            i, code = decode_args(name, args)
            if code not in h.w.reqs[i].net:
                kept.append((name, args, prop))
                continue
        elif judged(name, h.c):
            kept.append((name, args, prop))
            continue
        left += 1
    return kept, left


@dataclass
class ApiTourResult:
    config: str
    sequences: int = 0
    steps: int = 0
    probes: int = 0
    unprobed: int = 0
    coverage: Coverage = field(default_factory=lambda: Coverage(edges=set()))
    failures: list[tuple[int, Divergence]] = field(default_factory=list)
    seconds: float = 0.0
    early_nacks: int = 0  # Nacks the Senders read while writes were in flight
    early_aborts: int = 0  # aborts the Senders were given while writes were in flight


def run_api_tour(
    adapter: Adapter,
    plan: ApiPlan,
    mutants: frozenset[str] = NO_MUTANTS,
    *,
    seed: int = 0,
    limit: int | None = None,
) -> ApiTourResult:
    """Replay every walk of ``plan`` (see the module doc); a divergence ends its walk."""
    res = ApiTourResult(plan.config.name)
    t0 = time.process_time()
    probed: set[World] = set()

    def probe(h: Harness) -> None:
        if h.abs not in probed:
            probed.add(h.abs)
            got, left = api_probes(h)
            res.probes += len(got)
            res.unprobed += left
            h.probe_all(got)

    for k, seq in enumerate(plan.sequences[:limit]):
        res.sequences += 1
        try:
            h = ApiHarness(adapter, plan.config, mutants, seed, res.coverage)
            h.check_state()
            probe(h)
            for k, st in enumerate(seq):
                res.early_nacks += early_nacks(h, seq[k:])
                res.early_aborts += early_aborts(h, seq[k:])
                h.step(st["action"], st["args"])
                h.check_state()
                probe(h)
                res.steps += 1
            res.steps += drain(
                h,
                lambda w: close(w, plan.config),
                lambda w, n, i, a: declined(w, plan.config, n, i, a),
            )
        except Divergence as err:
            res.failures.append((k, err))
    res.seconds = time.process_time() - t0
    return res


def gap_of(err: Divergence) -> str:
    """A divergence's class: which check, at which action, on which fields (a "state
    differs" names the fields of ``diff``; any other check its kind alone)."""
    at = err.program[-1]["action"] if err.program else "init"
    first = str(err).splitlines()[0]
    fields: set[str] = set()
    if err.kind == "state differs" and "spec -> impl" in first:
        for part in first.split("spec -> impl", 1)[1].split(";"):
            name = part.strip().split(":")[0].split(" ")[0]
            fields.add(name.split(".", 1)[-1])
    return f"{err.kind} at {at}" + (f" ({', '.join(sorted(fields))})" if fields else "")


def api_report(plan: ApiPlan, res: ApiTourResult) -> dict[str, Any]:
    """Coverage of one world's tour on the API, and where it left the spec."""
    kinds: dict[str, int] = {}
    for _, err in res.failures:
        key = gap_of(err)
        kinds[key] = kinds.get(key, 0) + 1
    covered = len(plan.edge_keys & (res.coverage.edges or set()))
    got_pairs = {p for p, n in res.coverage.pairs.items() if n}
    pairs = {
        "pairs": len(plan.pairs),
        "pairs_covered": len(plan.pairs & got_pairs),
        "pairs_missed": sorted(f"{a} {o}" for a, o in plan.pairs - got_pairs),
    }
    return {
        "config": plan.config.name,
        "impl": "api",
        "goal": plan.goal,
        **(pairs if plan.goal == "pairs" else {}),
        "spec_states": plan.spec_states,
        "spec_edges": plan.spec_edges,
        "closed_states": plan.states,
        "edges": len(plan.edge_keys),
        "edges_covered": covered,
        "sequences": len(plan.sequences),
        "sequences_diverged": len(res.failures),
        "probes": res.probes,
        "probes_left_out": res.unprobed,
        "early_nacks": res.early_nacks,
        "early_aborts": res.early_aborts,
        "divergences": kinds,
        "seconds": round(res.seconds, 1),
    }
