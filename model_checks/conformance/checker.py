"""Check an engine's event log (JSONL, spec/EVENTLOG.md) against the spec.

Trace validation in the style of TLA+: the log is a behaviour with holes. Each logged
event must be a spec action enabled in a state the log so far reaches, where at most
``max_gap`` unlogged *assumable* steps (``ASSUMABLE``: message deliveries and network
faults) may be filled in before it. Request ids are concrete: no symmetry reduction.

A small frontier of candidate states is kept. An event that applies directly to one
needs no search; otherwise a BFS over assumable steps finds the fewest that enable it
(placed as late as possible, and reported as assumed). The verdict is the first event
that no candidate allows (with the refusal's property), whose successor breaks a safety
property, whose ``observed`` fields differ from the spec's successor (judged by the
properties the observed state breaks), or at which a request has waited past the
header's ``timeout_s`` (``BoundedExit``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from model_checks.conformance.events import (
    OBSERVABLE,
    Event,
    EventLog,
    LogError,
    Observed,
    parse_log,
)
from model_checks.explicit.trace import describe
from spec import state as S
from spec.actions import ACTIONS, WORKERS, encode_args
from spec.common import Mutants, Refused
from spec.config import Config
from spec.properties import violated_safety
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
_D_WAIT = (S.RESERVED, S.FILLING, S.QUARANTINED)  # spec.properties.decode_waiting, per request


class _Chain(NamedTuple):
    """Assumed steps before one logged line, linked to those before earlier lines."""

    line: int
    steps: tuple[tuple[str, int, int], ...]  # (action, request, argument)
    parent: _Chain | None


@dataclass
class Verdict:
    config: str
    events: int
    conforms: bool = True
    violated: str | None = None  # property ID (None: not allowed, no property named)
    line: int | None = None
    event: dict[str, Any] | None = None
    reason: str = ""
    state: str | None = None  # the state before the event, described
    assumed: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The issue's five keys first, then reason, state, config and events."""
        d = asdict(self)
        head = {k: d.pop(k) for k in ("conforms", "violated", "line", "event")}
        return {**head, "assumed_steps": d.pop("assumed"), **d}


def describe_world(w: World) -> str:
    parts = [f"r{i}: {describe(r)}" for i, r in enumerate(w.reqs)]
    extra = [f"{f}={getattr(w, f)}" for f in ("faults", "pfx", "pfx_ref") if getattr(w, f)]
    extra += [f"{f}=False" for f in ("p_up", "d_up") if not getattr(w, f)]
    return " | ".join(parts) + (" | " + " ".join(extra) if extra else "")


def _chain_steps(ch: _Chain | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while ch is not None:
        for name, i, arg in reversed(ch.steps):
            out.append({"before_line": ch.line, "action": name, "args": encode_args(name, i, arg)})
        ch = ch.parent
    out.reverse()
    return out


Node = tuple[World, _Chain | None]
_Open = tuple[World, _Chain | None, tuple[tuple[str, int, int], ...], int]  # + path, faults


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
    ) -> None:
        unknown = assumable - ACTIONS.keys()
        if unknown:
            raise ValueError(f"unknown assumable actions {sorted(unknown)}")
        self.c, self.m, self.k, self.timeout = c, mutants, max_gap, timeout_s
        acts = [ACTIONS[n] for n in sorted(assumable)]
        self._req = [a for a in acts if a.arg == "req"]
        self._glob = [a for a in acts if a.arg in ("global", "worker")]
        self._by_kind = {k: [a for a in acts if a.arg == "msg" and k in a.msgs] for k in MSG_NAMES}
        self.frontier: list[Node] = [(c.initial(), None)]
        self.waits: dict[tuple[str, int], tuple[int, float, int]] = {}
        self.verdict: Verdict | None = None
        self.n = 0

    def _apply(self, w: World, e: Event) -> World | Refused:
        a = e.action
        if a.arg == "msg" and e.arg not in w.reqs[e.i].net:
            return Refused(None)
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

    def _search(self, e: Event) -> tuple[list[tuple[World, Node]], tuple[Any, ...] | None]:
        """Fewest assumed steps that enable ``e``: (pre-state, successor) pairs, and the
        best refusal seen (fewest assumed faults, then most progress)."""
        best: tuple[Any, ...] | None = None
        seen = {w for w, _ in self.frontier}
        level: list[_Open] = [(w, ch, (), 0) for w, ch in self.frontier]
        for depth in range(1, self.k + 1):
            nxt: list[_Open] = []
            for w, ch, path, nf in level:
                for name, i, arg, s in self._moves(w):
                    if s not in seen and len(seen) < MAX_SEARCH:
                        seen.add(s)
                        fault = ACTIONS[name].kind == "fault"
                        nxt.append((s, ch, (*path, (name, i, arg)), nf + fault))
            found: list[tuple[int, World, Node]] = []
            for k, (s, ch, path, nf) in enumerate(nxt):
                r = self._apply(s, e)
                if type(r) is World:
                    found.append((nf, s, (r, _Chain(e.line, path, ch))))
                elif isinstance(r, Refused) and r.prop is not None:
                    key = (nf, -depth, k)
                    if best is None or key < best[0]:
                        best = (key, r.prop, s, _Chain(e.line, path, ch))
            if found or not nxt:
                found.sort(key=lambda x: x[0])  # paths with fewer assumed faults first
                return [(s, node) for _, s, node in found], best
            level = nxt
        return [], best

    def _fail(self, e: Event, prop: str | None, why: str, pre: World, ch: _Chain | None) -> None:
        ev = json.loads(e.raw)
        self.verdict = Verdict(
            self.c.name, self.n, False, prop, e.line, ev, why, describe_world(pre), _chain_steps(ch)
        )

    def step(self, e: Event) -> bool:
        """Replay one event; False (and ``verdict`` set) at a violation."""
        self.n += 1
        pairs: list[tuple[World, Node]] = []
        best: tuple[Any, ...] | None = None
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
            if best is None:
                w0, ch0 = self.frontier[0]
                why = f"not allowed: not enabled within {self.k} assumed steps"
                self._fail(e, None, why, w0, ch0)
                return False
            _, prop, pre, ch = best
            why = f"refused by the spec: it would break {prop}"
            if ch is not None and ch.line == e.line:
                n = len(ch.steps)
                why += f" (after {n} assumed steps; not enabled within --max-gap {self.k})"
            self._fail(e, prop, why, pre, ch)
            return False
        if e.obs is not None:
            ok = [p for p in pairs if self._matches(p[1][0], e.obs)]
            if not ok:
                return self._mismatch(e, pairs[0])
            pairs = ok
        for pre, (s, ch) in pairs:  # never fires on the correct spec (model-checked)
            if s is not pre:
                bad = violated_safety(s, self.c)
                if bad:
                    self._fail(e, bad[0], f"the step breaks {', '.join(bad)}", pre, ch)
                    return False
        self._set_frontier([p[1] for p in pairs])
        if self.timeout is not None and e.t is not None:
            return self._deadlines(e, pairs[0][0])
        return True

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
        bad = violated_safety(eng, self.c)
        spec = " ".join(f"{f}={OBSERVABLE[f][getattr(s.reqs[ri], f)]}" for f, _ in fields)
        seen = " ".join(f"{f}={OBSERVABLE[f][v]}" for f, v in fields)
        why = f"r{ri}: observed {seen}, the spec's step gives {spec}"
        why += f"; the observed state breaks {', '.join(bad)}" if bad else ""
        self._fail(e, bad[0] if bad else None, why, pre, ch)
        return False

    def _set_frontier(self, nodes: list[Node]) -> None:
        uniq: dict[World, Node] = {}
        for node in nodes:
            uniq.setdefault(node[0], node)
        self.frontier = list(uniq.values())[:MAX_FRONTIER]

    def _deadlines(self, e: Event, pre: World) -> bool:
        """BoundedExit, timed: no request may wait (decode holding blocks for an attempt,
        or prefill's sender waiting) past ``timeout_s`` while the log goes on."""
        assert e.t is not None and self.timeout is not None
        late: list[str] = []
        for i in range(self.c.n_reqs):
            for side in ("decode", "prefill"):
                rs = [w.reqs[i] for w, _ in self.frontier]
                if side == "decode":
                    eps = {r.dep if r.d in _D_WAIT else -1 for r in rs}
                else:
                    eps = {r.ep if r.ps != S.IDLE else -1 for r in rs}
                ep = eps.pop() if len(eps) == 1 else -1
                old = self.waits.pop((side, i), None)
                if ep < 0:
                    continue
                if old is None or old[0] != ep:
                    old = (ep, e.t, e.line)
                self.waits[(side, i)] = old
                if e.t - old[1] > self.timeout:
                    late.append(
                        f"{side} has waited on r{i} (epoch {ep}) since line {old[2]}"
                        f" (t={old[1]:g}), {e.t - old[1]:g}s > timeout_s={self.timeout:g}"
                    )
        if late:
            self._fail(e, "BoundedExit", "; ".join(late), pre, self.frontier[0][1])
        return not late

    def result(self) -> Verdict:
        if self.verdict is not None:
            return self.verdict
        return Verdict(self.c.name, self.n, assumed=_chain_steps(self.frontier[0][1]))


def check_log(log: EventLog, **kw: Any) -> Verdict:
    """Check a parsed log; ``kw``: ``max_gap``, ``assumable``, ``mutants`` (see Checker)."""
    ck = Checker(log.config, timeout_s=log.timeout_s, **kw)
    for e in log.events:
        if not ck.step(e):
            break
    return ck.result()


def check_text(data: bytes | str, config: str | None = None, **kw: Any) -> Verdict:
    """Parse and check; LogError on malformed input."""
    return check_log(parse_log(data, config), **kw)


def check_file(path: str | Path, config: str | None = None, **kw: Any) -> Verdict:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise LogError(None, f"cannot read {path}: {exc.strerror or exc}") from None
    return check_text(data, config, **kw)
