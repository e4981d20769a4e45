"""What an ``Unmodelled`` verdict had no path for: the event, why its action could not
act, and the nearest actions.

It runs only after the spec refused an event (or its observed effect) and no property
names the deviation. The guard is probed, not read: each one-field change of the state
that would let the action act is a conjunct the state failed (``needs``: ``st=prefilling``
says the guard wants the request prefilling); a message that is not in flight is named;
an earlier line that took the same step is named (a repeat); and the actions the spec
enables on the request in that state are listed, the nearest paths it does have.
"""

from __future__ import annotations

from typing import Any

from model_checks.explicit.trace import describe
from spec.actions import ACTIONS, encode_args, successors
from spec.common import Mutants
from spec.config import Config
from spec.state import REPLICA_NAMES, SENDER_NAMES, STATUS_NAMES, Req, World, msg_str

# The request fields whose every value is probed, with their names.
PROBED: dict[str, tuple[str, ...]] = {
    "st": STATUS_NAMES,
    "p": REPLICA_NAMES,
    "d": REPLICA_NAMES,
    "h": REPLICA_NAMES,
    "ps": SENDER_NAMES,
}
_EPOCHS = ("ep", "dep")  # probed one up and one down
_FLAGS = ("p_up", "d_up", "pfx")  # world booleans, probed flipped
MAX_LISTED = 8  # enabled actions a detail lists


def _acts(w: World, c: Config, m: Mutants, name: str, i: int, arg: int) -> bool:
    return type(ACTIONS[name].fn(w, c, m, i, arg)) is World


def _tries(r: Req) -> list[tuple[str, str, int]]:
    out = [(f, names[v], v) for f, names in PROBED.items() for v in range(len(names))]
    out += [(f, str(getattr(r, f) + d), getattr(r, f) + d) for f in _EPOCHS for d in (1, -1)]
    return [(f, shown, v) for f, shown, v in out if v >= 0 and getattr(r, f) != v]


def _needs(w: World, c: Config, m: Mutants, name: str, i: int, arg: int) -> list[str]:
    """The one-field changes of ``w`` under which ``name`` acts; if there are none, the
    two-field changes of the request (``p=writable+ps=idle``)."""
    out: list[str] = []
    a = ACTIONS[name]

    def acts(changes: tuple[tuple[str, int], ...]) -> bool:
        r, ch = w.reqs[i], dict(changes)
        r2 = Req._make(ch.get(g, getattr(r, g)) for g in Req._fields)
        return _acts(w._replace(reqs=(*w.reqs[:i], r2, *w.reqs[i + 1 :])), c, m, name, i, arg)

    tries = _tries(w.reqs[i]) if a.arg in ("req", "msg") else []
    out += [f"{f}={shown}" for f, shown, v in tries if acts(((f, v),))]
    for f in _FLAGS:
        w2 = World._make(not getattr(w, g) if g == f else getattr(w, g) for g in World._fields)
        if _acts(w2, c, m, name, i, arg):
            out.append(f"{f}={not getattr(w, f)}")
    if not out:
        for k, (f, s1, v1) in enumerate(tries):
            for g, s2, v2 in tries[k + 1 :]:
                if g != f and acts(((f, v1), (g, v2))) and len(out) < MAX_LISTED:
                    out.append(f"{f}={s1}+{g}={s2}")
    return out


def _enabled(w: World, c: Config, m: Mutants, i: int) -> list[str]:
    names: dict[str, None] = {}
    for name, j, arg, _s in successors(w, c, m):
        if j == i or ACTIONS[name].arg in ("global", "worker"):
            names[name if ACTIONS[name].arg != "msg" else f"{name}({msg_str(arg)})"] = None
    return list(names)[:MAX_LISTED]


def detail(
    w: World,
    c: Config,
    m: Mutants,
    act: tuple[str, int, int],
    line: int,
    done: dict[tuple[str, int, int], int],
    observed: str | None = None,
) -> dict[str, Any]:
    """The missing behaviour, for the verdict's ``unmodelled`` key: ``kind`` is one of
    ``observed`` (the step is the spec's, its observed effect is not), ``repeat``,
    ``not_in_flight``, ``guard`` (one-field changes that enable it are in ``needs``) or
    ``no_path`` (none does); ``missing`` says it in one sentence. ``done``: each step
    replayed so far -> the last line that took it."""
    name, i, arg = act
    a = ACTIONS[name]
    repeat_of = done.get(act)
    repeat_of = repeat_of if repeat_of is not None and repeat_of < line else None
    used = [n for k, n in done.items() if k[1:] == act[1:] and n < line]
    used_at = max(used, default=None) if a.arg == "msg" else None
    per_req = a.arg in ("req", "msg")
    who = f"r{i}" if per_req else "the world"
    state = describe(w.reqs[i]) if per_req else ", ".join(f"{f}={getattr(w, f)}" for f in _FLAGS)
    lost = a.arg == "msg" and arg not in w.reqs[i].net
    probe = w
    if lost:  # probe the guard as if the message were in flight
        r = w.reqs[i]._replace(net=tuple(sorted((*w.reqs[i].net, arg))))
        probe = w._replace(reqs=(*w.reqs[:i], r, *w.reqs[i + 1 :]))
    needs = [] if observed else _needs(probe, c, m, name, i, arg)
    if observed:
        kind = "observed"
        why = f"the spec's {name} gives {observed}, and no step of the spec leads there"
    elif lost and _acts(probe, c, m, name, i, arg):
        kind, why = "not_in_flight", f"{msg_str(arg)} is not in flight on {who}"
        why += f" (line {used_at} consumed it)" if used_at else " (no logged step sent it)"
        needs = [f"{msg_str(arg)} in flight"]
    elif needs:
        kind = "guard"
        why = f"{name} needs {' or '.join(needs)}" + (
            f" (and {msg_str(arg)} in flight)" if lost else ""
        )
    else:
        kind, why = "no_path", f"no one-field change of {who}'s state lets {name} act"
    if repeat_of is not None and not observed:
        kind, why = "repeat", f"it repeats line {repeat_of}'s step; {why}"
    enabled = _enabled(w, c, m, i)
    missing = f"line {line}: {name} on {who} ({state}) has no path: {why}"
    missing += f"; the spec enables here: {', '.join(enabled) or 'nothing'}"
    return {
        "line": line,
        "action": name,
        "args": encode_args(name, i, arg),
        "kind": kind,
        "needs": needs,
        "repeat_of": repeat_of,
        "consumed_at": used_at if lost else None,
        "enabled": enabled,
        "missing": missing,
    }
