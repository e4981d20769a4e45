"""Systematic refusal probes: every message in flight, offered to every action that
takes a message, plus forged ones, after every step.

The machine draws a step the spec does not enable only now and then, and
``arbitrary_step``'s random headers rarely match a message in flight, so a receiver that
wrongly accepts a duplicated Chunk, or a Ready of the wrong kind, survives thousands of
examples. ``refusal_probes(h)`` lists, for the current state, every (action, message)
the spec refuses, where the message is

- each message in flight (each action that takes a message, not enabled for it); and
- forged from one in flight: the same with its epoch one up or one down, with its index
  one up, and with each other kind of message (so: not in flight at all);
- and every action that takes no message (per request, per worker), where refused;

each with the spec's verdict (a refusal naming a property, or "not enabled"). The
harness then offers them all (``Harness.probe_all``): each must be refused naming the
spec's property, and the implementation must be unchanged after the whole round.
"""

from __future__ import annotations

from typing import Any

from refimpl.testing.harness import NO_MUTANTS, Harness
from spec.actions import ACTIONS, WORKERS, apply, encode_args
from spec.common import Refused
from spec.config import Config
from spec.state import MSG_NAMES, World, msg, msg_epoch, msg_idx, msg_kind

MSG_ACTIONS = tuple(n for n, a in ACTIONS.items() if a.arg == "msg")


def forged(code: int) -> set[int]:
    """Messages that differ from ``code`` in one field."""
    k, e, i = msg_kind(code), msg_epoch(code), msg_idx(code)
    out = {msg(k, e + 1, i), msg(k, e, i + 1)}
    if e > 0:
        out.add(msg(k, e - 1, i))
    out.update(msg(other, e, i) for other in MSG_NAMES if other != k)
    return out


OTHER_ACTIONS = tuple(n for n, a in ACTIONS.items() if a.arg != "msg")


def spec_refusals(w: World, c: Config) -> list[tuple[str, int, int, str | None]]:
    """(action, request, argument, the spec's property or None) for every probe of ``w``:
    the message probes above, and every other action (per request, per worker) the
    correct spec refuses here. On the spec alone: the graph tour (``tour``) reads the
    (action, outcome) pairs of every explored state from it."""
    out: list[tuple[str, int, int, str | None]] = []
    for name in OTHER_ACTIONS:
        a = ACTIONS[name]
        args = (
            [(0, wk) for wk in range(len(WORKERS))]
            if a.arg == "worker"
            else [(0, 0)]
            if a.arg == "global"
            else [(i, 0) for i in range(len(w.reqs))]
        )
        for i, arg in args:
            v = apply(w, c, NO_MUTANTS, name, i, arg)
            if isinstance(v, Refused):
                out.append((name, i, arg, v.prop))
    for i, r in enumerate(w.reqs):
        real = set(r.net)
        codes = real | {f for code in real for f in forged(code)}
        for code in sorted(codes):
            if msg_idx(code) > 15 or msg_epoch(code) > 15:
                continue  # outside the message encoding
            for name in MSG_ACTIONS:
                v = apply(w, c, NO_MUTANTS, name, i, code)
                if isinstance(v, Refused):
                    out.append((name, i, code, v.prop))
    return out


def refusal_probes(h: Harness) -> list[tuple[str, dict[str, Any], str | None]]:
    """(action, args, the spec's property or None) for every probe of the state
    (``spec_refusals``), in the trace form of the arguments."""
    return [
        (name, encode_args(name, i, arg), prop) for name, i, arg, prop in spec_refusals(h.w, h.c)
    ]
