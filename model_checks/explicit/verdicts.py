"""Safety verdicts learned from control fields, as ``enabling`` learns guards.

Most safety predicates decide most states from a few fields of each request (status,
replicas, sender phase, prefix hit, history flags) and the global fields. ``Verdicts``
runs each predicate once per *key* (those fields of every request, plus every global
field) on a stand-in state that holds only the key; any other field raises when read.
A predicate that returns without reading anything else has the same verdict in every
state with that key (same reads, same branches), so the explorer uses it instead of
calling the predicate; one that reads more (``net``, ``landed``, ...) is called on the
real state. The predicates stay in ``spec/properties.py``, evaluated in their order.

Key: ``(faults, p_up, d_up, pfx, pfx_ref, pfx_ok)`` and, per request, ``(st, p, d, h, ep,
dep, ps, hit, g)``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from spec.config import Config
from spec.invariants import for_config as invariants_for
from spec.properties import SAFETY, Pred
from spec.state import World

_REQ_FIELDS = ("st", "p", "d", "h", "ep", "dep", "ps", "hit", "g")
_WORLD_FIELDS = World._fields[1:]  # World[1:], in order

# (property ID, predicate, verdict): verdict True/False is known from the key; None: call it
Plan = tuple[tuple[str, Pred, bool | None], ...]


class _NeedMore(Exception):
    """The predicate read a field outside the key."""


def _opaque(*_: object) -> NoReturn:
    raise _NeedMore


class _Stand:
    """A record of which only some fields are known; any other use raises."""

    __slots__ = ("_known",)
    __getitem__ = _opaque
    __iter__ = _opaque
    __len__ = _opaque
    __bool__ = _opaque
    __eq__ = _opaque
    __ne__ = _opaque
    __lt__ = _opaque
    __hash__ = _opaque

    def __init__(self, known: dict[str, Any]) -> None:
        object.__setattr__(self, "_known", known)

    def __getattr__(self, name: str) -> Any:
        known: dict[str, Any] = object.__getattribute__(self, "_known")
        if name in known:
            return known[name]
        raise _NeedMore


def key_of(w: World) -> tuple[Any, ...]:
    """The control key of ``w`` (what ``Verdicts`` indexes by)."""
    return (w[1:], *[(*r[:7], r[9], r[17]) for r in w.reqs])


def _stand_in(key: tuple[Any, ...]) -> _Stand:
    reqs = tuple(_Stand(dict(zip(_REQ_FIELDS, rk, strict=True))) for rk in key[1:])
    return _Stand({"reqs": reqs, **dict(zip(_WORLD_FIELDS, key[0], strict=True))})


class Verdicts:
    """Per key, which safety predicates must still be called (the rest are known)."""

    def __init__(self, c: Config, preds: list[tuple[str, Pred]]) -> None:
        self.c, self.preds = c, preds
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self.learned = 0

    def plan(self, key: tuple[Any, ...]) -> Plan:
        got = self._plans.get(key)
        if got is None:
            stand = _stand_in(key)
            out: list[tuple[str, Pred, bool | None]] = []
            for pid, pred in self.preds:
                try:
                    verdict: bool | None = bool(pred(stand, self.c))  # type: ignore[arg-type]
                except Exception:  # _NeedMore, or anything the stand-in provoked
                    verdict = None
                if verdict is not True:
                    out.append((pid, pred, verdict))
            got = self._plans[key] = tuple(out)
            self.learned += 1
        return got


def state_preds(c: Config) -> list[tuple[str, Pred]]:
    """What every explorer checks on every new state, in this order: the safety
    properties, then INVARIANTS.md's conjuncts claimed in ``c``, by name."""
    return [(p.id, p.pred) for p in SAFETY if p.pred is not None] + invariants_for(c)
