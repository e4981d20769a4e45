"""Traces: the one JSON format, replay on the spec, pretty printing, DOT export.

A trace is ``{"config", "mutant", "violated", "trace": [{"action", "args"}]}``. Request
ids in ``args`` are concrete (stable from the initial state on): the explorer's
canonical slots are mapped back by replaying the path and tracking the permutation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from model_checks.explicit.explore import Graph, Label
from spec.actions import ACTIONS, apply, decode_args, encode_args
from spec.common import Mutants, Refused
from spec.config import Config
from spec.state import (
    REPLICA_NAMES,
    SENDER_NAMES,
    STATUS_NAMES,
    Req,
    World,
    canonical,
    canonical_perm,
    msg_str,
)

Step = dict[str, Any]


class TraceError(ValueError):
    """A trace step the spec refuses: ``index`` is 0-based, ``prop`` may name a property."""

    def __init__(self, index: int, step: Step, prop: str | None, detail: str) -> None:
        self.index, self.step, self.prop, self.detail = index, step, prop, detail
        super().__init__(f"step {index + 1} {step.get('action')}: {detail}")


def concretize(gr: Graph, labels: Iterable[Label]) -> list[Step]:
    """Map canonical-slot labels along a path to concrete request ids."""
    c, m = gr.config, gr.mutants
    w = c.initial()
    steps: list[Step] = []
    for name, i, arg in labels:
        if gr.symmetry:
            _, perm = canonical_perm(w)
            i = perm[i] if ACTIONS[name].arg in ("req", "msg") else i
        nxt = apply(w, c, m, name, i, arg)
        assert isinstance(nxt, World), f"path step {name} not enabled on replay"
        steps.append({"action": name, "args": encode_args(name, i, arg)})
        w = nxt
    return steps


def replay(c: Config, m: Mutants, steps: list[Step]) -> list[World]:
    """Apply ``steps`` from the initial state; raise TraceError at the first refusal."""
    w = c.initial()
    out = [w]
    for k, st in enumerate(steps):
        name = st.get("action")
        args = st.get("args", {})
        if not isinstance(name, str) or not isinstance(args, dict):
            raise TraceError(k, st, None, "a step needs 'action' (str) and 'args' (object)")
        try:
            i, arg = decode_args(name, args)
            nxt = apply(w, c, m, name, i, arg)
        except (KeyError, ValueError) as exc:
            raise TraceError(k, st, None, str(exc)) from None
        if isinstance(nxt, Refused):
            why = f"refused: would break {nxt.prop}" if nxt.prop else "not enabled"
            raise TraceError(k, st, nxt.prop, why)
        w = nxt
        out.append(w)
    return out


def same_state(a: World, b: World) -> bool:
    return canonical(a) == canonical(b)


_ENUMS = {
    "st": STATUS_NAMES,
    "p": REPLICA_NAMES,
    "d": REPLICA_NAMES,
    "h": REPLICA_NAMES,
    "ps": SENDER_NAMES,
}


def _field(name: str, v: int) -> str:
    names = _ENUMS.get(name)
    return names[v] if names is not None else str(v)


def describe(r: Req) -> str:
    """A compact one-line rendering of a request."""
    parts = [f"{f}={_field(f, getattr(r, f))}" for f in ("st", "p", "d", "h", "ps")]
    parts += [f"{f}={getattr(r, f)}" for f in ("ep", "dep", "landed", "rmask") if getattr(r, f)]
    if r.net:
        parts.append("net=[" + ", ".join(msg_str(x) for x in r.net) + "]")
    return " ".join(parts)


def diff(a: World, b: World) -> list[str]:
    """What changed between two concrete states, field by field."""
    out: list[str] = []
    for i, (ra, rb) in enumerate(zip(a.reqs, b.reqs, strict=True)):
        for f in Req._fields:
            va, vb = getattr(ra, f), getattr(rb, f)
            if va == vb:
                continue
            if f == "net":
                gone = list(va)
                added = []
                for x in vb:
                    if x in gone:
                        gone.remove(x)
                    else:
                        added.append(x)
                out += [f"r{i}.net +{msg_str(x)}" for x in added]
                out += [f"r{i}.net -{msg_str(x)}" for x in gone]
            else:
                out.append(f"r{i}.{f}: {_field(f, va)} -> {_field(f, vb)}")
    for f in World._fields[1:]:
        if getattr(a, f) != getattr(b, f):
            out.append(f"{f}: {getattr(a, f)} -> {getattr(b, f)}")
    return out


def pretty(c: Config, m: Mutants, steps: list[Step], violated: str | None = None) -> str:
    """Action by action, with what changed at each step (TLC style)."""
    worlds = replay(c, m, steps)
    lines = [f"config {c.name}" + (f", mutant {', '.join(sorted(m))}" if m else "")]
    lines.append("  0 Init: " + " | ".join(describe(r) for r in worlds[0].reqs))
    for k, (st, a, b) in enumerate(zip(steps, worlds, worlds[1:], strict=False), start=1):
        args = ", ".join(f"{key}={val}" for key, val in st["args"].items())
        lines.append(f"{k:3d} {st['action']}({args})")
        changes = diff(a, b)
        lines += [f"      {x}" for x in changes] if changes else ["      (no change)"]
    if violated:
        lines.append(f"  => violates {violated}")
    return "\n".join(lines)


@dataclass
class Trace:
    config: str
    mutant: str | None
    violated: str | None
    steps: list[Step]

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "mutant": self.mutant,
            "violated": self.violated,
            "trace": self.steps,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)


def to_dot(gr: Graph, path: list[Step] | None = None, max_states: int = 5000) -> str:
    """Graphviz DOT of a small state graph, or of a counterexample path only."""
    lines = ["digraph kvown {", '  node [shape=box, fontname="monospace", fontsize=9];']
    if path is not None:
        worlds = replay(gr.config, gr.mutants, path)
        for k, w in enumerate(worlds):
            label = "\\n".join(describe(r) for r in w.reqs)
            lines.append(f'  s{k} [label="{label}"];')
        for k, st in enumerate(path):
            lines.append(f'  s{k} -> s{k + 1} [label="{st["action"]}"];')
    else:
        if gr.n_states > max_states:
            raise ValueError(
                f"config {gr.config.name} has {gr.n_states} states; DOT is for graphs of at"
                f" most {max_states} (use --mutant to draw a counterexample instead)"
            )
        for k, w in enumerate(gr.states):
            label = "\\n".join(describe(r) for r in w.reqs)
            lines.append(f'  s{k} [label="{label}"];')
        for s, d, lb in zip(gr.src, gr.dst, gr.lab, strict=True):
            lines.append(f'  s{s} -> s{d} [label="{lb[0]}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
