"""Event logs (JSONL, spec/EVENTLOG.md) parsed line by line into ``Event`` records.

``LineParser`` is the streaming form (memory: one line, whatever the log's length): the
header, then one ``Event`` per line with its action instance, optional ``observed``
fields, timestamp and clock. ``parse_log`` collects a whole log into an ``EventLog``.
Malformed input raises ``LogError`` naming the line, never anything else.

Clocks are per worker: an event is stamped by its actor's clock (``prefill``,
``decode``, or ``env``/``client`` for the orchestrator's and the router's events;
``Now`` names its worker), or by the process the line names (``clock``, or a cluster
log's ``proc``: one clock per process), which the header must declare with the worker
that owns it (``clocks``): a fresh clock name could otherwise hide a stall. A clock that
goes backwards is an input error. The header's ``clock_skew_s`` bounds how far two
clocks may disagree (default ``DEFAULT_SKEW_S``); with ``timeout_s`` set, a reading more
than that below an earlier line's reading of another clock is an input error too (the
log is not merged by time, or its clocks are not synchronised as stated).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from model_checks.conformance.jsonline import LogError, cut, loads_line, show, text_lines
from model_checks.conformance.sizing import prescan
from spec.actions import ACTIONS, WORKERS, Action, check_arg_keys, decode_args
from spec.behaviours import compose
from spec.config import Config, get_config
from spec.state import MSG_NAMES, REPLICA_NAMES, SENDER_NAMES, STATUS_NAMES, msg_kind

OBSERVABLE = {"st": STATUS_NAMES, "p": REPLICA_NAMES, "d": REPLICA_NAMES, "h": REPLICA_NAMES}
OBSERVABLE["ps"] = SENDER_NAMES
NOW = "Now"  # a log event, not a spec action: a worker marks the time without acting
CLOCKS = {"P": "prefill", "D": "decode", "env": "env", "client": "client"}
OWNERS = ("prefill", "decode", "env", "client")  # the workers that own clocks
MAX_T = 1e12  # seconds; larger timestamps and timeouts are refused
# NTP keeps the hosts of one cluster within milliseconds of each other: 0.1 s is a
# generous bound for them, and far below any engine's transfer timeout.
DEFAULT_SKEW_S = 0.1
MAX_CLOCKS = 64  # named process clocks a header may declare, or a log name without one
_EPS = 1e-9  # float slack when comparing readings of two clocks

Observed = tuple[int, tuple[tuple[str, int], ...]]  # (request, ((field, value), ...))


class Event(NamedTuple):
    line: int
    action: Action | None  # None: a ``Now`` event
    i: int  # request slot (0 for global and worker actions)
    arg: int  # message code, worker index, or 0
    t: float | None  # timestamp in seconds, on ``clock``
    obs: Observed | None  # the engine's view of one request after the event
    obj: dict[str, Any]  # the line as parsed (what a verdict quotes)
    clock: str  # the owning worker (prefill, decode, env, client), "/<name>" for a named clock

    @property
    def name(self) -> str:
        return NOW if self.action is None else self.action.name


@dataclass
class EventLog:
    config: Config
    events: list[Event]
    timeout_s: float | None = None
    clock_skew_s: float = DEFAULT_SKEW_S
    clocks: dict[str, str] = field(default_factory=dict)  # named process clock -> its worker


def _num(v: object) -> bool:
    return (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and 0 <= v <= MAX_T
    )


def _observed(line: int, ob: object, a: Action, i: int, c: Config) -> Observed:
    if not isinstance(ob, dict):
        raise LogError(line, "'observed' must be an object")
    req = ob.get("req", i if a.arg in ("req", "msg") else None)
    if type(req) is not int or not 0 <= req < c.n_reqs:
        raise LogError(line, f"'observed' needs 'req' in 0..{c.n_reqs - 1}, got {show(req)}")
    fields: list[tuple[str, int]] = []
    for k, v in ob.items():
        if k == "req":
            continue
        names = OBSERVABLE.get(k)
        if names is None:
            raise LogError(line, f"'observed' field {show(k)} is not one of {sorted(OBSERVABLE)}")
        if type(v) is not str or v not in names:
            raise LogError(line, f"'observed' {k} must be one of {list(names)}, got {show(v)}")
        fields.append((k, names.index(v)))
    return (req, tuple(fields))


def _args(line: int, name: str, obj: dict[str, Any]) -> dict[str, Any]:
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise LogError(line, f"{name}: 'args' must be an object")
    for k in ("msg", "worker"):
        if k in args and type(args[k]) is not str:
            raise LogError(line, f"{name}: argument {k!r} must be a string, got {show(args[k])}")
    return args


def _declared(n: int, obj: dict[str, Any]) -> dict[str, str]:
    """The header's named process clocks, each with the worker that owns it."""
    ck = obj.get("clocks", {})
    if not isinstance(ck, dict) or len(ck) > MAX_CLOCKS:
        why = f"an object of at most {MAX_CLOCKS} process names, each with its worker"
        raise LogError(n, f"'clocks' must be {why}, got {show(ck)}")
    for name, owner in ck.items():
        if not 0 < len(name) <= 64 or not name.isprintable() or name in OWNERS:
            why = f"a printable name of 1..64 characters, other than {list(OWNERS)}"
            raise LogError(n, f"'clocks': a process name must be {why}, got {show(name)}")
        if type(owner) is not str or owner not in OWNERS:
            raise LogError(n, f"'clocks': {show(name)} must be owned by one of {list(OWNERS)}")
    return dict(ck)


def _now(line: int, obj: dict[str, Any]) -> Event:
    args = _args(line, NOW, obj)
    wk = args.get("worker")
    if wk not in WORKERS:
        raise LogError(line, f"Now: argument 'worker' must be one of {WORKERS}, got {show(wk)}")
    try:
        check_arg_keys(NOW, "worker", args)
    except ValueError as exc:
        raise LogError(line, cut(str(exc))) from None
    if "observed" in obj:
        raise LogError(line, "Now: an event that does nothing has no 'observed'")
    return Event(line, None, 0, WORKERS.index(wk), None, None, obj, wk)


_BY_REQ = {n: a for n, a in ACTIONS.items() if a.arg == "req"}


def _event(line: int, obj: dict[str, Any], c: Config) -> Event:
    name = obj.get("action")
    a = _BY_REQ.get(name) if type(name) is str else None
    if a is not None:  # the common shape, {"req": R} only: checked here in full
        args = obj.get("args")
        if type(args) is dict and len(args) == 1:
            req = args.get("req")
            if type(req) is int and 0 <= req < c.n_reqs:
                ob = obj.get("observed")
                obs = None if ob is None else _observed(line, ob, a, req, c)
                return Event(line, a, req, 0, None, obs, obj, CLOCKS[a.actor])
    if type(name) is not str:
        raise LogError(line, f"an event needs 'action' (a string), got {show(name)}")
    if name == NOW:
        return _now(line, obj)
    a = ACTIONS.get(name)
    if a is None:
        raise LogError(line, f"unknown action {show(name)}")
    args = _args(line, name, obj)
    try:
        i, arg = decode_args(name, args)
    except (ValueError, TypeError, KeyError) as exc:
        raise LogError(line, cut(str(exc))) from None
    if a.arg in ("req", "msg") and i >= c.n_reqs:
        raise LogError(line, f"{name}: request {i} out of range 0..{c.n_reqs - 1} ({c.name})")
    if a.arg == "msg" and msg_kind(arg) not in a.msgs:
        kinds = sorted(MSG_NAMES[k] for k in a.msgs)
        raise LogError(line, f"{name}: consumes {kinds}, not {show(args.get('msg'))}")
    ob = obj.get("observed")
    obs = None if ob is None else _observed(line, ob, a, i, c)
    return Event(line, a, i, arg, None, obs, obj, CLOCKS[a.actor])


def _more_requests(c: Config, obj: dict[str, Any]) -> Config:
    args, ob = obj.get("args"), obj.get("observed")
    most = c.n_reqs
    for d in (args, ob):
        req = d.get("req") if isinstance(d, dict) else None
        if type(req) is int and most <= req < 4096:
            most = req + 1
    return c if most == c.n_reqs else replace(c, n_reqs=most)


def _switches(n: int, obj: dict[str, Any], c: Config) -> Config:
    """The header's behaviour switches on top of the named config: ``transport``
    ("revocable" or "unrevocable": ``Config.revocable``) and ``decode_failure`` (a bool)."""
    revocable, decode_failure = c.revocable, c.decode_failure
    t = obj.get("transport")
    if t is not None:
        if t not in ("revocable", "unrevocable"):
            raise LogError(n, f"'transport' must be revocable or unrevocable, got {show(t)}")
        revocable = t == "revocable"
    f = obj.get("decode_failure")
    if f is not None:
        if type(f) is not bool:
            raise LogError(n, f"'decode_failure' must be true or false, got {show(f)}")
        decode_failure = f
    if (revocable, decode_failure) == (c.revocable, c.decode_failure):
        return c
    return replace(c, revocable=revocable, decode_failure=decode_failure)


class LineParser:
    """Feed physical lines in order; ``feed`` returns the line's ``Event`` (None for a
    header or blank line). ``finish`` refuses a log without events."""

    def __init__(
        self,
        config: str | None = None,
        timeout_s: float | None = None,
        sizes: dict[str, int] | None = None,
    ) -> None:
        self.config_name = config
        self.sizes = dict(sizes or {})  # a declared world's sizes read ahead (sizing.py)
        self.c: Config | None = None
        self.c0: Config | None = None  # the config the header declared, before the log grew it
        self.timeout_given = timeout_s  # the caller's timeout wins over the header's
        self.timeout: float | None = timeout_s
        self.skew = DEFAULT_SKEW_S
        self.skew_stated = False  # the header states clock_skew_s: then it is a promise
        self.implicit: dict[str, str] = {}  # an undeclared process clock -> its first worker
        self.owners: dict[str, str] = {}  # a declared process clock -> the worker owning it
        self.clocks: dict[str, tuple[float, int]] = {}  # clock -> (last t, its line)
        self.top: tuple[float, str, int] | None = None  # the highest reading: (t, clock, line)
        self.last = 0
        self.n_events = 0

    def _header(self, n: int, obj: dict[str, Any]) -> Config:
        name = self.config_name if self.config_name is not None else obj.get("config")
        if name is None and any(k in obj for k in ("behaviours", "faults", "sizes")):
            c = self._declared_world(n, obj)
        elif name is None:
            raise LogError(
                n, "no config: give --config NAME, or a header with 'config' or 'behaviours'"
            )
        elif type(name) is not str:
            raise LogError(n, f"'config' must be a string, got {show(name)}")
        else:
            try:
                c = get_config(name)
            except KeyError:
                where = None if self.config_name else n
                msg = f"unknown config {show(name)} (`kvown list` names them)"
                raise LogError(where, msg) from None
        if "version" in obj and (type(obj["version"]) is not int or obj["version"] != 1):
            raise LogError(n, f"unsupported version {show(obj['version'])} (this checker reads 1)")
        ts = obj.get("timeout_s")
        if ts is not None and (not _num(ts) or ts == 0):
            raise LogError(n, f"'timeout_s' must be a positive number <= {MAX_T:g}, got {show(ts)}")
        self.timeout = None if ts is None else float(ts)
        if self.timeout_given is not None:
            self.timeout = self.timeout_given
        sk = obj.get("clock_skew_s", DEFAULT_SKEW_S)
        if not _num(sk):
            raise LogError(n, f"'clock_skew_s' must be a number in 0..{MAX_T:g}, got {show(sk)}")
        self.skew = float(sk)
        self.skew_stated = "clock_skew_s" in obj
        self.owners = _declared(n, obj)
        return _switches(n, obj, c)

    def _declared_world(self, n: int, obj: dict[str, Any]) -> Config:
        """A header that declares its behaviours (and may give sizes): the world is built
        from them (``spec/behaviours/compose.py``), the sizes it lacks read from the log
        ahead (``self.sizes``: ``sizing.prescan``) or grown as the log shows more."""
        got: dict[str, Any] = {}
        for key in ("behaviours", "faults"):
            v = obj.get(key, [])
            if not isinstance(v, list) or not all(type(x) is str for x in v):
                raise LogError(n, f"{key!r} must be a list of names, got {show(v)}")
            got[key] = v
        sizes = obj.get("sizes", {})
        if not isinstance(sizes, dict) or not all(
            type(v) is int and 0 <= v <= 4096 for v in sizes.values()
        ):
            raise LogError(n, f"'sizes' must map names to integers in 0..4096, got {show(sizes)}")
        ahead = {k: v for k, v in self.sizes.items() if k not in sizes}
        try:
            return compose.world(got["behaviours"], got["faults"], {**ahead, **sizes})
        except ValueError as exc:
            raise LogError(n, cut(str(exc))) from None

    def _clock(self, n: int, e: Event, sub: object) -> Event:
        """The clock that stamped ``e``: its worker's, or the declared process ``sub``."""
        if type(sub) is not str or not 0 < len(sub) <= 64:
            raise LogError(n, f"'clock' must be a short string, got {show(sub)}")
        owner = sub if sub in OWNERS else self.owners.get(sub)
        if owner is None and e.clock in WORKERS and not self.owners:
            # no 'clocks' in the header: a process clock named on a prefill or decode
            # line is that worker's (it is one of its processes, as a TP rank is)
            if sub not in self.implicit and len(self.implicit) >= MAX_CLOCKS:
                raise LogError(
                    n,
                    f"clock {show(sub)}: more than {MAX_CLOCKS} process clocks named without"
                    " a header 'clocks' (the checker keeps each clock's readings; a log"
                    f" names at most {MAX_CLOCKS})",
                )
            owner = self.implicit.setdefault(sub, e.clock)
        if owner is None:
            known = sorted(self.owners) or "none"
            raise LogError(
                n,
                f"clock {show(sub)} is not declared (the header's 'clocks' names each process"
                f" clock and its worker; declared: {cut(str(known), 60)})",
            )
        if e.clock in WORKERS and owner != e.clock:  # env/client events: any process logs them
            raise LogError(n, f"{e.name} is a {e.clock} event, but clock {show(sub)} is {owner}'s")
        return e._replace(clock=owner if sub == owner else f"{owner}/{sub}")

    def _order(self, n: int, clock: str, t: float) -> None:
        """With a timeout and a stated ``clock_skew_s``, durations are read across clocks:
        the log must be in time order up to that skew. Without a stated skew the log
        promises nothing across clocks; ``clocks.Deadlines`` stops comparing two clocks
        once they disagree by more than the default skew."""
        top = self.top
        if (
            self.skew_stated
            and top is not None
            and top[1] != clock
            and t < top[0] - self.skew - _EPS
        ):
            raise LogError(
                n,
                f"the {clock} clock reads t={t:g} after the {top[1]} clock read t={top[0]:g}"
                f" at line {top[2]}: further apart than clock_skew_s={self.skew:g}"
                " (merge the log by time, or state the clocks' real skew)",
            )
        if top is None or t > top[0]:
            self.top = (t, clock, n)

    def feed(self, n: int, raw: bytes | str) -> Event | None:
        """One physical line (numbered ``n``); None for a blank or header line."""
        if not raw.strip():
            return None
        return self.feed_obj(n, loads_line(n, raw))

    def feed_obj(self, n: int, obj: object) -> Event | None:
        """One line already parsed (the online monitor's entry; ``n`` numbers it)."""
        self.last = n
        if not isinstance(obj, dict):
            raise LogError(n, "each line must be a JSON object")
        if self.c is None:  # the first line: a header, or an event that names the config
            self.c = self.c0 = self._header(n, obj)
            if "action" not in obj:
                return None
        if self.c.from_log:  # a declared world has as many requests as the log shows
            self.c = _more_requests(self.c, obj)
        e = _event(n, obj, self.c)
        sub = obj.get("clock", obj.get("proc"))
        if sub is not None:
            e = self._clock(n, e, sub)
        t = obj.get("t")
        if t is not None and not _num(t):
            raise LogError(n, f"'t' must be a number of seconds in 0..{MAX_T:g}, got {show(t)}")
        if t is None and (self.timeout is not None or e.action is None):
            why = "a Now event" if e.action is None else "timeout_s is set, so every event"
            raise LogError(n, f"{why} needs 't'")
        if t is not None:
            prev = self.clocks.get(e.clock)
            if prev is not None and t < prev[0]:
                raise LogError(
                    n,
                    f"the {e.clock} clock goes backwards: t={t:g} after t={prev[0]:g}"
                    f" at line {prev[1]}",
                )
            self.clocks[e.clock] = (float(t), n)
            if self.timeout is not None:
                self._order(n, e.clock, float(t))
            e = e._replace(t=float(t))
        self.n_events += 1
        return e

    def finish(self) -> None:
        if self.c is None or not self.n_events:
            raise LogError(self.last + 1, "empty log: no events")

    def events(self, lines: Iterable[tuple[int, bytes | str]]) -> Iterator[Event]:
        for n, raw in lines:
            e = self.feed(n, raw)
            if e is not None:
                yield e
        self.finish()


def parse_log(data: bytes | str, config: str | None = None) -> EventLog:
    """Parse a whole in-memory log; raise LogError at the first malformed line."""
    p = LineParser(config, sizes=prescan(text_lines(data)))
    events = list(p.events(text_lines(data)))
    assert p.c0 is not None  # a declared world grows again as the checker replays it
    return EventLog(p.c0, events, p.timeout, p.skew, p.owners)
