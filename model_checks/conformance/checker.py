"""Check an engine's event log (JSONL, spec/EVENTLOG.md) against the spec, event by event.

Trace validation in the style of TLA+: the log is a behaviour with holes. Each logged
event must be a spec action enabled in a state the log so far reaches, where at most
``max_gap`` unlogged *assumable* steps (``ASSUMABLE``: message deliveries and network
faults) may be filled in before it. Request ids are concrete: no symmetry reduction.

Assumed steps are hypotheses. A frontier of candidate states (each with the chain of
steps it assumed) is kept; an event that applies directly to one needs no search, else
a BFS over assumable steps finds the fewest that enable it. When no candidate explains
a line and an earlier line was explained only by assuming a delivery that a later line
shows had not happened yet, the verdict moves to that earlier line (judged without the
assumption). Every verdict names a property
(``blame``), or ``Unmodelled`` with what had no path (``nearest``). Waits are timed on
per-worker clocks with a stated skew bound (``clocks``: ``BoundedExit``); at the end of
the log a stall with blocks held is ``NoDeadlock``.
"""

from __future__ import annotations

from typing import Any

from model_checks.conformance.blame import UNMODELLED, blame, blame_observed, blame_state
from model_checks.conformance.clocks import Deadlines
from model_checks.conformance.events import DEFAULT_SKEW_S, OBSERVABLE, Event, Observed
from model_checks.conformance.growth import grow
from model_checks.conformance.nearest import detail
from model_checks.conformance.refute import assumes, bears_on, failed_at_fence, refutation
from model_checks.conformance.stall import stuck
from model_checks.conformance.verdict import Chain, Verdict, chain_steps, describe_world
from spec.actions import ACTIONS, WORKERS
from spec.common import Mutants, Refused
from spec.config import Config
from spec.state import MSG_NAMES, Req, World, msg_kind

DEFAULT_MAX_GAP = 6  # enough for a handoff_tp2to1 log that logs no delivery at all
MAX_FRONTIER = 64  # candidate states kept between events
MAX_SEARCH = 20_000  # states one gap search may visit

# Assumable: every step that moves or alters a message in flight (deliveries, and the
# network's loss, duplication, corruption and manifest swap). Everything else is an
# engine decision or an event the engine sees (its own steps, timeouts, a cancel, a
# failed store, a crash) and must be logged.
ASSUMABLE: frozenset[str] = frozenset(
    a.name for a in ACTIONS.values() if a.kind == "recv" or (a.kind == "fault" and a.arg == "msg")
)
Node = tuple[World, Chain | None]
# (state, chain, assumed path, faults assumed, the frontier state the path starts from)
_Open = tuple[World, Chain | None, tuple[tuple[str, int, int], ...], int, World]
_Best = tuple[tuple[int, int, int], str, World, Chain | None]  # key, property, pre, chain


class Checker:
    """Replays events one at a time; ``verdict`` is set at the first violation."""

    def __init__(
        self,
        c: Config,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        assumable: frozenset[str] = ASSUMABLE,
        mutants: Mutants = frozenset(),
        timeout_s: float | None = None,
        clock_skew_s: float = DEFAULT_SKEW_S,
        clocks: dict[str, str] | None = None,
        open_end: bool = False,
    ) -> None:
        unknown = assumable - ACTIONS.keys()
        if unknown:
            raise ValueError(f"unknown assumable actions {sorted(unknown)}")
        if max_gap < 0:
            raise ValueError(f"max_gap must be >= 0, got {max_gap}")
        self.c, self.m, self.k, self.timeout = c, mutants, max_gap, timeout_s
        self.skew = clock_skew_s
        self.clocks = dict(clocks or {})  # the header's named process clocks -> their worker
        self.open_end = open_end
        acts = [ACTIONS[n] for n in sorted(assumable)]
        self._req = [a for a in acts if a.arg == "req"]
        self._glob = [a for a in acts if a.arg in ("global", "worker")]
        self._by_kind = {k: [a for a in acts if a.arg == "msg" and k in a.msgs] for k in MSG_NAMES}
        self.frontier: list[Node] = [(c.initial(), None)]
        self.waits = Deadlines(c.n_reqs, timeout_s or 0.0, clock_skew_s)
        self.verdict: Verdict | None = None
        self.pending: tuple[Verdict, list[Node]] | None = None  # an Unmodelled verdict on hold
        self._nodes: list[Node] = []  # the explanations the last failed line was judged in
        self.done: dict[tuple[str, int, int], int] = {}  # a step -> the last line that took it
        self.n = 0
        self.last: Event | None = None

    # -- the spec, with assumed steps ---------------------------------------------

    def _apply(self, w: World, e: Event) -> World | Refused:
        a = e.action
        assert a is not None
        if a.arg == "msg" and e.arg not in w.reqs[e.i].net:
            return w if failed_at_fence(w, self.c, a.name, e.i, e.arg) else Refused(None)
        return a.fn(w, self.c, self.m, e.i, e.arg)

    def _moves(self, w: World) -> list[tuple[str, int, int, World]]:
        out: list[tuple[str, int, int, World]] = []
        c, m = self.c, self.m
        for i, r in enumerate(w.reqs):
            for a in self._req:
                s = a.fn(w, c, m, i, 0)
                if type(s) is World:
                    out.append((a.name, i, 0, s))
            for code in sorted(set(r.net)):
                for a in self._by_kind[msg_kind(code)]:
                    s = a.fn(w, c, m, i, code)
                    if type(s) is World:
                        out.append((a.name, i, code, s))
        for a in self._glob:
            for wk in range(len(WORKERS) if a.arg == "worker" else 1):
                s = a.fn(w, c, m, 0, wk)
                if type(s) is World:
                    out.append((a.name, 0, wk, s))
        return out

    def _link(self, e: Event, path: tuple[Any, ...], ch: Chain | None, pre: World) -> Chain:
        assert e.action is not None
        return Chain(e.line, path, ch, pre, (e.action.name, e.i, e.arg), e.obj)

    def _search(self, e: Event) -> tuple[list[tuple[World, Node]], _Best | None]:
        """Fewest assumed steps that enable ``e``: (pre-state, successor) pairs, and the
        best refusal seen (fewest assumed faults, then most progress)."""
        best: _Best | None = None
        seen = {w for w, _ in self.frontier}
        level: list[_Open] = [(w, ch, (), 0, w) for w, ch in self.frontier]
        for depth in range(1, self.k + 1):
            nxt: list[_Open] = []
            for w, ch, path, nf, root in level:
                for name, i, arg, s in self._moves(w):
                    if s not in seen and len(seen) < MAX_SEARCH:
                        seen.add(s)
                        fault = ACTIONS[name].kind == "fault"
                        nxt.append((s, ch, (*path, (name, i, arg)), nf + fault, root))
            found: list[tuple[int, World, Node]] = []
            for k, (s, ch, path, nf, root) in enumerate(nxt):
                r = self._apply(s, e)
                if type(r) is World:
                    found.append((nf, s, (r, self._link(e, path, ch, root))))
                elif isinstance(r, Refused) and r.prop is not None:
                    key = (nf, -depth, k)
                    if best is None or key < best[0]:
                        best = (key, r.prop, s, self._link(e, path, ch, root))
            if found or not nxt:
                found.sort(key=lambda x: x[0])  # paths with fewer assumed faults first
                return [(s, node) for _, s, node in found], best
            level = nxt
        return [], best

    # -- verdicts -----------------------------------------------------------------

    def _fail(
        self,
        line: int,
        obj: dict[str, Any] | None,
        props: list[str],
        why: str,
        pre: World,
        ch: Chain | None,
        refuted_by: int | None = None,
        act: tuple[str, int, int] | None = None,
        observed: str | None = None,
    ) -> bool:
        props = props or [UNMODELLED]
        gap: dict[str, Any] | None = None
        if props == [UNMODELLED]:
            why += "; no property of the spec explains it (a finding about the spec)"
            if act is not None:
                gap = detail(pre, self.c, self.m, act, line, self.done, observed)
                why += f": {gap['missing']}"
        self.verdict = Verdict(
            self.c.name,
            self.n,
            False,
            props[0],
            line,
            obj,
            why,
            describe_world(pre),
            chain_steps(ch),
            props,
            refuted_by,
            unmodelled=gap,
            clocks=self.clocks,
            timeout_s=self.timeout,
            clock_skew_s=self.skew,
        )
        return False

    def _blame(self, w: World, e: Event) -> list[str]:
        a = e.action
        assert a is not None
        return blame(w, self.c, a.name, a.actor, e.i, e.arg, a.arg == "msg")

    def _refuted(self, e: Event, nodes: list[Node] | None = None, need: bool = False) -> bool:
        """``e`` is enabled in no explanation (``nodes``: the frontier by default). If an
        explanation assumed ``e``'s own delivery (or another use of its message) before an
        earlier line, that line is where the log stopped being explainable: judge it
        without the assumption (``refute.refutation``; ``need``: only with a property)."""
        a = e.action
        assert a is not None
        hit = refutation(self.frontier if nodes is None else nodes, e, self.c, self.m, need)
        if hit is None:
            return False
        line, props, link = hit
        steps = ", ".join(f"{n}(r{i})" for n, i, _ in link.steps)
        why = (
            f"line {line} is explained only by assuming {steps} before it, but line {e.line}"
            f" logs {a.name} after it; without that assumption the spec refuses line {line}"
        )
        if props:
            why += f": it breaks {', '.join(props)}"
        self._fail(line, link.obj, props, why, link.pre, link, e.line, link.event)
        return True

    def _refusal(self, e: Event, best: _Best | None) -> bool:
        if self._refuted(e):
            return False
        if best is None:
            w0, ch0 = self.frontier[0]
            props = self._blame(w0, e)
            why = f"not enabled (within {self.k} assumed steps)"
            if props:
                why += f": the engine's step breaks {', '.join(props)}"
            return self._fail(e.line, e.obj, props, why, w0, ch0, act=self._act(e))
        _, prop, pre, ch = best
        props = [prop] + [p for p in self._blame(pre, e) if p != prop]
        why = f"refused by the spec: it would break {prop}"
        if ch is not None and ch.line == e.line:
            n = len(ch.steps)
            why += f" (after {n} assumed steps; not enabled within --max-gap {self.k})"
        return self._fail(e.line, e.obj, props, why, pre, ch)

    def step(self, e: Event) -> bool:
        """Replay one event; False (and ``verdict`` set) at a violation. An ``Unmodelled``
        verdict on assumed steps waits (``pending``) for a line that ``bears_on`` them: one
        logging an assumed step refutes it (rule 4 of spec/EVENTLOG.md's verdicts)."""
        self.n += 1
        if self.pending is not None:
            return self._resolve(e)
        if self.c.from_log:
            self._grow(e)
        self._nodes = []
        if self._step(e) or not self._defer():
            return self.verdict is None
        return True

    def _grow(self, e: Event) -> None:
        """A declared world widens to what ``e`` needs (``growth.grow``)."""
        self.c, extra = grow(self.c, [w for w, _ in self.frontier], e)
        if extra:
            more, self.waits.n = (Req(),) * extra, self.c.n_reqs
            self.frontier = [(w._replace(reqs=w.reqs + more), ch) for w, ch in self.frontier]

    def _defer(self) -> bool:
        v = self.verdict
        if v is None or v.violated != UNMODELLED or v.refuted_by is not None:
            return False
        if not any(ch is not None and assumes(ch) for _, ch in self._nodes):
            return False
        self.pending, self.verdict = (v, self._nodes), None
        return True

    def _resolve(self, e: Event) -> bool:
        """A line after a pending Unmodelled verdict: does it refute the assumption?"""
        assert self.pending is not None
        if not bears_on(self.pending[1], e):  # a Now, another request's line: still open
            return True
        (self.verdict, nodes), self.pending = self.pending, None
        if e.action is not None and not any(type(self._apply(s, e)) is World for s, _ in nodes):
            self._refuted(e, nodes, need=True)
        return False

    def _step(self, e: Event) -> bool:
        self.last = e
        a = e.action
        if a is None:  # Now: time passes, nothing acts
            return self._deadlines(e)
        if len(self.frontier) == 1 and e.obs is None:  # the common case: one candidate
            w, ch = self.frontier[0]
            if a.arg != "msg" or e.arg in w.reqs[e.i].net:
                s = a.fn(w, self.c, self.m, e.i, e.arg)
                if type(s) is World and (s is w or not blame_state(s, self.c)):
                    self.frontier = [(s, ch)]
                    self.done[(a.name, e.i, e.arg)] = e.line
                    return self.timeout is None or self._deadlines(e)
        pairs: list[tuple[World, Node]] = []
        best: _Best | None = None
        for k, (w, ch) in enumerate(self.frontier):
            r = self._apply(w, e)
            if type(r) is World:
                pairs.append((w, (r, ch)))
            elif isinstance(r, Refused) and r.prop is not None and best is None:
                best = ((0, 0, k), r.prop, w, ch)
        if not pairs:
            pairs, deeper = self._search(e)
            if deeper is not None and (best is None or deeper[0] < best[0]):
                best = deeper
        if not pairs:
            self._nodes = self.frontier
            return self._refusal(e, best)
        if e.obs is not None:
            ok = [p for p in pairs if self._matches(p[1][0], e.obs)]
            if not ok:
                self._nodes = [p[1] for p in pairs]
                return self._mismatch(e, pairs[0])
            pairs = ok
        for pre, (s, ch) in pairs:  # never fires on the correct spec (model-checked)
            if s is not pre:
                bad = blame_state(s, self.c)
                if bad:
                    why = f"the step breaks {', '.join(bad)}"
                    return self._fail(e.line, e.obj, bad, why, pre, ch)
        self._set_frontier([p[1] for p in pairs])
        self.done[(a.name, e.i, e.arg)] = e.line
        return self._deadlines(e)

    @staticmethod
    def _matches(s: World, obs: Observed) -> bool:
        r = s.reqs[obs[0]]
        return all(getattr(r, f) == v for f, v in obs[1])

    def _mismatch(self, e: Event, pair: tuple[World, Node]) -> bool:
        """The engine's observed effect differs from the spec's: judge the engine's state."""
        pre, (s, ch) = pair
        ri, fields = e.obs or (0, ())
        new = dict(fields)
        r = s.reqs[ri]
        r2 = Req._make(new.get(f, getattr(r, f)) for f in Req._fields)
        eng = s._replace(reqs=(*s.reqs[:ri], r2, *s.reqs[ri + 1 :]))
        bad = blame_observed(
            pre, eng, self.c, e.arg, e.action is not None and e.action.arg == "msg"
        )
        spec = " ".join(f"{f}={OBSERVABLE[f][getattr(s.reqs[ri], f)]}" for f, _ in fields)
        seen = " ".join(f"{f}={OBSERVABLE[f][v]}" for f, v in fields)
        why = f"r{ri}: observed {seen}, the spec's step gives {spec}"
        why += f"; the observed state breaks {', '.join(bad)}" if bad else ""
        note = f"{spec} on r{ri}, the engine observed {seen}"
        return self._fail(e.line, e.obj, bad, why, pre, ch, act=self._act(e), observed=note)

    @staticmethod
    def _act(e: Event) -> tuple[str, int, int]:
        assert e.action is not None
        return (e.action.name, e.i, e.arg)

    def _set_frontier(self, nodes: list[Node]) -> None:
        if len(nodes) == 1:
            self.frontier = nodes
            return
        uniq: dict[World, Node] = {}
        for node in nodes:
            uniq.setdefault(node[0], node)
        self.frontier = list(uniq.values())[:MAX_FRONTIER]

    # -- time and the end of the log ------------------------------------------------

    def _deadlines(self, e: Event) -> bool:
        """BoundedExit (``clocks.Deadlines``): a wait past ``timeout_s``."""
        if self.timeout is None or e.t is None:
            return True
        late = self.waits.observe(e, [w for w, _ in self.frontier])
        if late:
            w0, ch0 = self.frontier[0]
            return self._fail(e.line, e.obj, ["BoundedExit"], "; ".join(late), w0, ch0)
        return True

    def _stuck(self, w: World) -> str | None:
        return stuck(w, self.c, self.m, self.timeout is not None, MAX_SEARCH)

    def finish(self) -> Verdict:
        """The end of the log (unless ``open_end``): a stall is NoDeadlock, at the last line."""
        if self.pending is not None:
            self.verdict, self.pending = self.pending[0], None
        if self.verdict is None and not self.open_end and self.last is not None:
            stuck = [self._stuck(w) for w, _ in self.frontier]
            if all(stuck):
                why = (
                    "the log ends with blocks held that no run of protocol steps can free"
                    f" (only a timeout or a fault could; a silent stall): {stuck[0]}"
                )
                w0, ch0 = self.frontier[0]
                self._fail(self.last.line, self.last.obj, ["NoDeadlock"], why, w0, ch0)
        return self.result()

    def result(self) -> Verdict:
        if self.pending is not None:
            return self.pending[0]
        if self.verdict is not None:
            return self.verdict
        assumed = chain_steps(self.frontier[0][1])
        return Verdict(
            self.c.name,
            self.n,
            assumed=assumed,
            timeout_s=self.timeout,
            clock_skew_s=self.skew,
            clocks=self.clocks,
        )
