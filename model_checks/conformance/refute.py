"""Two readings of a log the checker needs beside the spec (issue #32 item 3).

``failed_at_fence``: a write the engine reports as failed after decode's fence already
failed it. ``assumes``: does an explanation rest on assumed steps (an ``Unmodelled``
verdict on one waits for a line that ``bears_on`` it, ``Checker.step``)? ``refutation``: the
earliest line whose explanation a later line refutes, judged without the assumption.
"""

from __future__ import annotations

from model_checks.conformance.blame import blame, ordered
from model_checks.conformance.events import Event
from model_checks.conformance.verdict import Chain
from spec import state as S
from spec.actions import ACTIONS
from spec.common import Mutants, Refused
from spec.config import Config
from spec.state import World, msg_epoch, msg_kind

__all__ = ["assumes", "bears_on", "failed_at_fence", "refutation"]


def failed_at_fence(w: World, c: Config, name: str, i: int, code: int) -> bool:
    """A write the engine reports as failed (``DecodeReceiveChunk`` of a ``ChunkCorrupt``)
    of an attempt decode has fenced on a revocable transport: the fence already failed
    it (``drop_chunks`` took it out of flight), so the report is that failure, logged
    late. It lands nothing, so the line changes no state (a stutter). A good ``Chunk``
    delivered after the fence is a write that landed: the spec refuses it."""
    if name != "DecodeReceiveChunk" or msg_kind(code) != S.M_CHUNK_BAD or not c.revocable:
        return False
    r = w.reqs[i]
    if code - ((S.M_CHUNK_BAD - S.M_CHUNK) << 4) in r.net:
        return False  # the write is still in flight: its delivery is the spec's own
    e = msg_epoch(code)
    return (e == r.dep and bool(r.dfl & S.DF_FENCED)) or e < r.dep


def assumes(ch: Chain | None) -> bool:
    """Some line of the explanation was explained with assumed steps."""
    while ch is not None:
        if ch.steps:
            return True
        ch = ch.parent
    return False


def bears_on(nodes: list[tuple[World, Chain | None]], e: Event) -> bool:
    """Can line ``e`` decide an assumption of ``nodes``' explanations? A ``Now`` (nothing
    acts) cannot, nor a line of a request no assumed step acts on: a pending
    ``Unmodelled`` verdict stays open across them (issue #32)."""
    if e.action is None:
        return False
    for _w, ch in nodes:
        while ch is not None:
            if any(i == e.i for _n, i, _arg in ch.steps):
                return True
            ch = ch.parent
    return False


def refutation(
    nodes: list[tuple[World, Chain | None]], e: Event, c: Config, m: Mutants, need: bool
) -> tuple[int, list[str], Chain] | None:
    """The earliest line an explanation in ``nodes`` explained by assuming ``e``'s step
    (or another use of its message) before it, with the properties it breaks without
    the assumption (``need``: only a line that breaks some property counts)."""
    a = e.action
    assert a is not None
    hits: list[tuple[int, list[str], Chain]] = []
    for _w, ch in nodes:
        link = ch
        while link is not None:
            used = any(
                (n == a.name or a.arg == "msg") and i == e.i and arg == e.arg
                for n, i, arg in link.steps
            )
            if used:
                name, i, arg = link.event
                act = ACTIONS[name]
                if act.arg == "msg" and arg not in link.pre.reqs[i].net:
                    r: World | Refused = Refused(None)
                else:
                    r = act.fn(link.pre, c, m, i, arg)
                if isinstance(r, Refused):
                    props = [r.prop] if r.prop else []
                    props += blame(link.pre, c, name, act.actor, i, arg, act.arg == "msg")
                    if props or not need:
                        hits.append((link.line, ordered(props), link))
                break
            link = link.parent
    return min(hits, key=lambda h: h[0]) if hits else None
