"""Event logs (JSONL, spec/EVENTLOG.md) parsed line by line into ``Event`` records.

``LineParser`` is the streaming form (memory: one line, whatever the log's length): the
header, then one ``Event`` per line with its action instance, optional ``observed``
fields, timestamp and clock. ``parse_log`` collects a whole log into an ``EventLog``.
Malformed input raises ``LogError`` naming the line, never anything else.

Clocks are per worker: an event is stamped by its actor's clock (``prefill``,
``decode``, or ``env``/``client`` for the orchestrator's and the router's events;
``Now`` names its worker), or by the process the line names (``clock``, or a cluster
log's ``proc``: one clock per process). A clock that goes backwards is an input error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from model_checks.conformance.jsonline import LogError, cut, loads_line, show, text_lines
from spec.actions import ACTIONS, WORKERS, Action, check_arg_keys, decode_args
from spec.config import Config, get_config
from spec.state import MSG_NAMES, REPLICA_NAMES, SENDER_NAMES, STATUS_NAMES, msg_kind

OBSERVABLE = {"st": STATUS_NAMES, "p": REPLICA_NAMES, "d": REPLICA_NAMES, "h": REPLICA_NAMES}
OBSERVABLE["ps"] = SENDER_NAMES
NOW = "Now"  # a log event, not a spec action: a worker marks the time without acting
CLOCKS = {"P": "prefill", "D": "decode", "env": "env", "client": "client"}
MAX_T = 1e12  # seconds; larger timestamps and timeouts are refused

Observed = tuple[int, tuple[tuple[str, int], ...]]  # (request, ((field, value), ...))


class Event(NamedTuple):
    line: int
    action: Action | None  # None: a ``Now`` event
    i: int  # request slot (0 for global and worker actions)
    arg: int  # message code, worker index, or 0
    t: float | None  # timestamp in seconds, on ``clock``
    obs: Observed | None  # the engine's view of one request after the event
    obj: dict[str, Any]  # the line as parsed (what a verdict quotes)
    clock: str  # prefill, decode, env or client; "/<name>" added when the line names its clock

    @property
    def name(self) -> str:
        return NOW if self.action is None else self.action.name


@dataclass
class EventLog:
    config: Config
    events: list[Event]
    timeout_s: float | None = None


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

    def __init__(self, config: str | None = None) -> None:
        self.config_name = config
        self.c: Config | None = None
        self.timeout: float | None = None
        self.clocks: dict[str, tuple[float, int]] = {}  # clock -> (last t, its line)
        self.last = 0
        self.n_events = 0

    def _header(self, n: int, obj: dict[str, Any]) -> Config:
        name = self.config_name if self.config_name is not None else obj.get("config")
        if name is None:
            raise LogError(n, "no config: give --config NAME or a header with 'config'")
        if type(name) is not str:
            raise LogError(n, f"'config' must be a string, got {show(name)}")
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
        return _switches(n, obj, c)

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
            self.c = self._header(n, obj)
            if "action" not in obj:
                return None
        e = _event(n, obj, self.c)
        sub = obj.get("clock", obj.get("proc"))
        if sub is not None:
            if type(sub) is not str or not 0 < len(sub) <= 64:
                raise LogError(n, f"'clock' must be a short string, got {show(sub)}")
            e = e._replace(clock=f"{e.clock}/{sub}")
        t = obj.get("t")
        if t is not None and not _num(t):
            raise LogError(n, f"'t' must be a number of seconds in 0..{MAX_T:g}, got {show(t)}")
        if t is None and (self.timeout is not None or e.action is None):
            why = "a Now event" if e.action is None else "the header sets timeout_s, so every event"
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
    p = LineParser(config)
    events = list(p.events(text_lines(data)))
    assert p.c is not None
    return EventLog(p.c, events, p.timeout)
