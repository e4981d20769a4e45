"""A declared world grows as its log shows more (issue #32; ``spec/behaviours/compose``).

Before each logged step of a world built from the log's header, ``grow`` widens the
config to what the step needs: another request (a fresh, queued one in every candidate
state: it holds nothing and has nothing in flight, so it is as if it had been there from
the start), another handoff attempt (a freeze, or a message of a later epoch), another
turn, another offload, preemption or retraction, another restart, and each logged fault
(its kind, and one more in the fault budget). Assumed faults stay within the budget the
header gives (``sizes.faults``, default 1) beyond the faults the log shows.
"""

from __future__ import annotations

from model_checks.conformance.events import Event
from spec.behaviours.compose import FAULT_OF, grown
from spec.config import Config
from spec.state import M_CHUNK_BAD, M_HANDOFF_BAD, Req, World, msg_epoch, msg_kind

__all__ = ["grow"]

_TURNS = frozenset({"TurnEnd", "TurnRoute", "TurnPrefill"})
_MOVES = frozenset({"PrefillOffloadBegin", "PrefillPreempt", "DecodeRetract", "HostStoreBegin"})
_PRODUCTS = {M_CHUNK_BAD: "corrupt", M_HANDOFF_BAD: "mismatch"}  # a fault's message


def _requests(c: Config, worlds: list[World], e: Event) -> tuple[Config, int]:
    a = e.action
    assert a is not None
    need = e.i + 1 if a.arg in ("req", "msg") else 1
    if e.obs is not None:
        need = max(need, e.obs[0] + 1)
    return (c, 0) if need <= c.n_reqs else (grown(c, n_reqs=need), need - c.n_reqs)


def grow(c: Config, worlds: list[World], e: Event) -> tuple[Config, int]:
    """The config ``e`` needs, and how many requests to add to each candidate state."""
    a = e.action
    if a is None:
        return c, 0
    c, extra = _requests(c, worlds, e)
    rs = [w.reqs[e.i] if e.i < len(w.reqs) else Req() for w in worlds]
    kw: dict[str, int] = {}
    if a.name == "PrefillFreeze":
        kw["max_attempts"] = max(r.ep for r in rs) + 1
    if a.arg == "msg":
        kw["max_attempts"] = max(kw.get("max_attempts", 1), msg_epoch(e.arg))
    if a.name in _TURNS:
        kw["max_turns"] = max(r.tc for r in rs) + 1
    if a.name in _MOVES:
        kw["max_moves"] = max(r.mv for r in rs) + 1
    kind, more = FAULT_OF.get(a.name), 0
    if kind is not None:
        more = 1
    elif a.name == "EnvRestart":
        kw["restarts"] = max(w.p_inc + w.d_inc for w in worlds) + 1
        kind = "crash"
    if a.arg == "msg" and msg_kind(e.arg) in _PRODUCTS:
        kind, more = _PRODUCTS[msg_kind(e.arg)], 1
    return grown(c, kind, more, **kw), extra
