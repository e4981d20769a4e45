"""Which actions can be enabled, learned from the spec's own guards.

Most of the ~25 per-request actions are disabled in a given state, and a spec action
usually says so after reading a few control fields (status, replicas, sender phase,
worker liveness). ``Enabling`` learns that once per *key*, the tuple of those fields, by
running the action on a stand-in state that holds only the key: every other field
raises ``_NeedMore`` when read. If the action returns a refusal without touching
anything else, it is a deterministic function of the key there (same reads, same
branches, same result), so it is disabled in every state with that key and the
explorer never calls it for them. If it reads anything else (or fails in any way), it
stays a candidate and the explorer calls it on the real state. Nothing is assumed
about the protocol: the guards stay in ``spec/`` and this only skips calls whose
outcome is already known.

Keys: ``(slot, p_up, d_up, faults, st, p, d, h, ep, dep, ps)`` for request actions, and
that key plus the message code for message actions.
"""

from __future__ import annotations

from typing import Any, NoReturn

from spec.actions import ACTIONS, Action
from spec.common import Mutants, Refused
from spec.config import Config
from spec.state import MSG_NAMES, World, msg_kind

_REQ_KEY = ("st", "p", "d", "h", "ep", "dep", "ps")  # Req fields 0..6, in order
_WORLD_KEY = ("p_up", "d_up", "faults")
_KEY_LEN = len(_REQ_KEY)

ReqKey = tuple[Any, ...]


class _NeedMore(Exception):
    """The action read a field outside the key: its outcome is not known from the key."""


def _opaque(*_: object) -> NoReturn:
    raise _NeedMore


class _Opaque:
    """Stands in for a record whose fields are not in the key: any use raises."""

    __slots__ = ()
    __getattr__ = _opaque
    __getitem__ = _opaque
    __iter__ = _opaque
    __len__ = _opaque
    __bool__ = _opaque
    __eq__ = _opaque
    __ne__ = _opaque
    __lt__ = _opaque
    __hash__ = _opaque


class _KeyReq(_Opaque):
    """A request of which only the key fields are known."""

    __slots__ = _REQ_KEY

    def __init__(self, key: tuple[int, ...]) -> None:
        for name, v in zip(_REQ_KEY, key, strict=True):
            object.__setattr__(self, name, v)


class _KeyWorld(_Opaque):
    """A world of which only the acting request's key and ``_WORLD_KEY`` are known."""

    __slots__ = ("reqs", *_WORLD_KEY)

    def __init__(self, n: int, i: int, p_up: bool, d_up: bool, faults: int, rk: ReqKey) -> None:
        reqs = tuple(_KeyReq(rk) if j == i else _Opaque() for j in range(n))
        for name, v in zip(("reqs", *_WORLD_KEY), (reqs, p_up, d_up, faults), strict=True):
            object.__setattr__(self, name, v)


def _disabled(a: Action, kw: _KeyWorld, c: Config, m: Mutants, i: int, arg: int) -> bool:
    """True only when ``a`` refuses on the key alone."""
    try:
        res = a.fn(kw, c, m, i, arg)  # type: ignore[arg-type]
    except Exception:  # _NeedMore, or anything a stand-in provoked: stay a candidate
        return False
    return isinstance(res, Refused)


class Enabling:
    """Candidate actions per key, learned lazily for one config and set of mutants."""

    def __init__(self, c: Config, m: Mutants) -> None:
        self.c, self.m, self.n = c, m, c.n_reqs
        self.req_actions = tuple(a for a in ACTIONS.values() if a.arg == "req")
        self.by_msg = {
            k: tuple(a for a in ACTIONS.values() if a.arg == "msg" and k in a.msgs)
            for k in MSG_NAMES
        }
        self._req: dict[tuple[Any, ...], tuple[Action, ...]] = {}
        self._msg: dict[tuple[Any, ...], tuple[Action, ...]] = {}
        self.learned = 0  # keys learned (request and message keys together)

    def _kw(self, key: tuple[Any, ...]) -> _KeyWorld:
        i, p_up, d_up, faults = key[0], key[1], key[2], key[3]
        return _KeyWorld(self.n, i, p_up, d_up, faults, key[4 : 4 + _KEY_LEN])

    def req(self, key: tuple[Any, ...]) -> tuple[Action, ...]:
        """Request actions that may be enabled for ``key`` (in registry order)."""
        got = self._req.get(key)
        if got is None:
            kw, i = self._kw(key), key[0]
            got = tuple(a for a in self.req_actions if not _disabled(a, kw, self.c, self.m, i, 0))
            self._req[key] = got
            self.learned += 1
        return got

    def msg(self, key: tuple[Any, ...], code: int) -> tuple[Action, ...]:
        """Message actions on ``code`` that may be enabled for ``key``."""
        mk = (key, code)
        got = self._msg.get(mk)
        if got is None:
            kw, i = self._kw(key), key[0]
            got = tuple(
                a
                for a in self.by_msg[msg_kind(code)]
                if not _disabled(a, kw, self.c, self.m, i, code)
            )
            self._msg[mk] = got
            self.learned += 1
        return got


def req_key(w: World, i: int) -> tuple[Any, ...]:
    """The key of request ``i`` of ``w`` (what ``Enabling`` indexes by)."""
    return (i, w.p_up, w.d_up, w.faults, *w.reqs[i][:_KEY_LEN])
