"""The verdict on an event log, and the words used to describe states and assumed steps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from model_checks.explicit.trace import describe
from spec.actions import encode_args
from spec.state import World


@dataclass
class Verdict:
    """Conforms, or the first line no explanation of the log survives, with every
    property it breaks (``violated`` is the most specific; ``Unmodelled`` when the spec
    has no property for it)."""

    config: str
    events: int
    conforms: bool = True
    violated: str | None = None  # most specific property ID, "Unmodelled", None: conforms
    line: int | None = None
    event: dict[str, Any] | None = None
    reason: str = ""
    state: str | None = None  # the state before the event, described
    assumed: list[dict[str, Any]] = field(default_factory=list)  # the explanation tried
    properties: list[str] = field(default_factory=list)  # all broken, most specific first
    refuted_by: int | None = None  # a later line that ruled the last explanation out
    # Unmodelled: the event that had no path, why, and the nearest actions (nearest.py)
    unmodelled: dict[str, Any] | None = None
    timeout_s: float | None = None  # the header's timing: BoundedExit's bound,
    clock_skew_s: float | None = None  # the most two clocks may disagree,
    clocks: dict[str, str] = field(default_factory=dict)  # each named clock's worker

    def to_json(self) -> dict[str, Any]:
        """The five keys first (conforms, violated, line, event, assumed_steps), then the rest."""
        d = asdict(self)
        head = {k: d.pop(k) for k in ("conforms", "violated", "line", "event")}
        return {**head, "assumed_steps": d.pop("assumed"), **d}


class Chain(NamedTuple):
    """Assumed steps before one logged line, linked to those before earlier lines. The
    state before them and the line's own action are kept, so a later line can refute
    the assumption and the line be judged without it."""

    line: int
    steps: tuple[tuple[str, int, int], ...]  # (action, request, argument)
    parent: Chain | None
    pre: World  # the state before the assumed steps
    event: tuple[str, int, int]  # the logged line's (action, request, argument)
    obj: dict[str, Any]  # the logged line as parsed


def describe_world(w: World) -> str:
    parts = [f"r{i}: {describe(r)}" for i, r in enumerate(w.reqs)]
    extra = [f"{f}={getattr(w, f)}" for f in ("faults", "pfx", "pfx_ref") if getattr(w, f)]
    extra += [f"{f}=False" for f in ("p_up", "d_up") if not getattr(w, f)]
    extra += [f"{f}={getattr(w, f)}" for f in ("p_inc", "d_inc") if getattr(w, f)]
    return " | ".join(parts) + (" | " + " ".join(extra) if extra else "")


def chain_steps(ch: Chain | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while ch is not None:
        for name, i, arg in reversed(ch.steps):
            out.append({"before_line": ch.line, "action": name, "args": encode_args(name, i, arg)})
        ch = ch.parent
    out.reverse()
    return out
