"""Event logs (JSONL, spec/EVENTLOG.md) parsed into ``EventLog``: the header, then one
``Event`` per line with its action instance, optional ``observed`` fields and timestamp.
Malformed input raises ``LogError`` naming the line."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from spec.actions import ACTIONS, Action, decode_args
from spec.config import Config, get_config
from spec.state import MSG_NAMES, REPLICA_NAMES, SENDER_NAMES, STATUS_NAMES, msg_kind

OBSERVABLE = {"st": STATUS_NAMES, "p": REPLICA_NAMES, "d": REPLICA_NAMES, "h": REPLICA_NAMES}
OBSERVABLE["ps"] = SENDER_NAMES


class LogError(ValueError):
    """Malformed input; ``line`` is 1-based (None: not tied to a line)."""

    def __init__(self, line: int | None, msg: str) -> None:
        self.line, self.msg = line, msg
        super().__init__(f"line {line}: {msg}" if line is not None else msg)


Observed = tuple[int, tuple[tuple[str, int], ...]]  # (request, ((field, value), ...))


class Event(NamedTuple):
    line: int
    action: Action
    i: int  # request slot (0 for global and worker actions)
    arg: int  # message code, worker index, or 0
    t: float | None  # timestamp in seconds
    obs: Observed | None  # the engine's view of one request after the event
    raw: str


@dataclass
class EventLog:
    config: Config
    events: list[Event]
    timeout_s: float | None = None


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _observed(line: int, ob: object, a: Action, i: int, c: Config) -> Observed:
    if not isinstance(ob, dict):
        raise LogError(line, "'observed' must be an object")
    req = ob.get("req", i if a.arg in ("req", "msg") else None)
    if not isinstance(req, int) or isinstance(req, bool) or not 0 <= req < c.n_reqs:
        raise LogError(line, f"'observed' needs 'req' in 0..{c.n_reqs - 1}, got {req!r}")
    fields: list[tuple[str, int]] = []
    for k, v in ob.items():
        if k == "req":
            continue
        names = OBSERVABLE.get(k)
        if names is None:
            raise LogError(line, f"'observed' field {k!r} is not one of {sorted(OBSERVABLE)}")
        if v not in names:
            raise LogError(line, f"'observed' {k} must be one of {list(names)}, got {v!r}")
        fields.append((k, names.index(v)))
    return (req, tuple(fields))


def _event(line: int, obj: dict[str, Any], raw: str, c: Config, need_t: bool) -> Event:
    name = obj.get("action")
    if not isinstance(name, str):
        raise LogError(line, "an event needs 'action' (a string)")
    a = ACTIONS.get(name)
    if a is None:
        raise LogError(line, f"unknown action {name!r}")
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise LogError(line, f"{name}: 'args' must be an object")
    try:
        i, arg = decode_args(name, args)
    except ValueError as exc:
        raise LogError(line, str(exc)) from None
    if a.arg in ("req", "msg") and i >= c.n_reqs:
        raise LogError(line, f"{name}: request {i} out of range 0..{c.n_reqs - 1} ({c.name})")
    if a.arg == "msg" and msg_kind(arg) not in a.msgs:
        kinds = sorted(MSG_NAMES[k] for k in a.msgs)
        raise LogError(line, f"{name}: consumes {kinds}, not {args.get('msg')!r}")
    t = obj.get("t")
    if t is not None and not _num(t):
        raise LogError(line, f"'t' must be a non-negative number of seconds, got {t!r}")
    if t is None and need_t:
        raise LogError(line, "the header sets timeout_s, so every event needs 't'")
    ob = obj.get("observed")
    obs = None if ob is None else _observed(line, ob, a, i, c)
    return Event(line, a, i, arg, None if t is None else float(t), obs, raw)


def _lines(data: bytes | str) -> Iterator[tuple[int, str]]:
    if isinstance(data, str):
        yield from enumerate(data.split("\n"), start=1)
        return
    for n, b in enumerate(data.split(b"\n"), start=1):
        try:
            yield n, b.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LogError(n, f"not UTF-8 ({exc.reason})") from None


def parse_log(data: bytes | str, config: str | None = None) -> EventLog:
    """Parse a whole log; raise LogError at the first malformed line."""
    events: list[Event] = []
    c: Config | None = None
    timeout: float | None = None
    last = 0
    for n, line in _lines(data):
        if not line.strip():
            continue
        last = n
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LogError(n, f"bad JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise LogError(n, "each line must be a JSON object")
        if c is None:  # the first line: a header, or an event that names the config
            name = config if config is not None else obj.get("config")
            if name is None:
                raise LogError(n, "no config: give --config NAME or a header with 'config'")
            if not isinstance(name, str):
                raise LogError(n, f"'config' must be a string, got {name!r}")
            try:
                c = get_config(name)
            except KeyError as exc:
                raise LogError(None if config else n, str(exc.args[0])) from None
            if "version" in obj and obj["version"] != 1:
                raise LogError(n, f"unsupported version {obj['version']!r} (this checker reads 1)")
            ts = obj.get("timeout_s")
            if ts is not None and (not _num(ts) or ts == 0):
                raise LogError(n, f"'timeout_s' must be a positive number, got {ts!r}")
            timeout = None if ts is None else float(ts)
            if "action" not in obj:
                continue
        events.append(_event(n, obj, line, c, timeout is not None))
    if c is None or not events:
        raise LogError(last + 1, "empty log: no events")
    return EventLog(c, events, timeout)
