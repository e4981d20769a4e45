"""Hand-made states for the spec tests."""

from __future__ import annotations

from typing import Any

from spec.actions import apply
from spec.common import Refused
from spec.config import CONFIGS, Config
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    FILLING,
    M_HANDOFF,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
    Req,
    World,
    msg,
)


def W(*reqs: Req, **globals_: object) -> World:  # noqa: N802 - reads like a constructor
    return World(reqs=tuple(reqs), **globals_)  # type: ignore[arg-type]


def R(**fields: object) -> Req:  # noqa: N802
    return Req(**fields)  # type: ignore[arg-type]


HO = CONFIGS["handoff_tp2to1"]  # src_tp=2, blocks=2: 4 chunks, 2 RankDones
OFF = CONFIGS["offload_contend"]  # two requests, cap_p=3, cap_h=2, recompute
PFX = CONFIGS["prefix_share"]  # blocks=1, prefix=1 (zero-block handoffs)
CR = CONFIGS["handoff_crash"]

RUN_P = R(st=RUNNING, p=WRITABLE)
FROZEN = R(st=RUNNING, p=COMPLETE, ep=1, ps=AWAIT_READY, net=(msg(M_HANDOFF, 1),))
SENDING1 = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, d=RESERVED, ps=SENDING)
ALL_SENT = R(
    st=RUNNING, p=COMPLETE, ep=1, dep=1, d=FILLING, ps=AWAIT_ACK, landed=0b1111, rmask=0b11
)
HELD = R(st=RUNNING, p=COMPLETE, ep=1, dep=1, ps=AWAIT_ACK)


def check_guard(name: str, c: Config, w: World, i: int, arg: int, expected: Any) -> None:
    """One guard-table row: ``expected`` is ("refused"|"disabled", PROP) or the request-i
    fields the successor must have."""
    res = apply(w, c, frozenset(), name, i, arg)
    if isinstance(expected, tuple):
        assert isinstance(res, Refused), f"{name} should be refused, got {res}"
        assert res.prop == expected[1]
    else:
        assert not isinstance(res, Refused), f"{name} refused with {res.prop}"
        r = res.reqs[i]
        for field, value in expected.items():
            assert getattr(r, field) == value, (field, getattr(r, field), value)
