"""Async steps (``spec/behaviours/async_steps.py``): dispatch and completion guards, the
refusals while a step is in flight, the property extensions, and the mutants."""

from __future__ import annotations

from typing import Any

import pytest

from model_checks.explicit.runner import check_config, check_mutant
from spec.actions import apply
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import frozen_snapshot, no_reuse_under_io, quiescent_terminal
from spec.state import (
    AWAIT_READY,
    CANCELLED,
    COMPLETE,
    FINISHED,
    IDLE,
    NONE,
    PREFILLING,
    RUNNING,
    WRITABLE,
    Req,
    World,
)

AS = CONFIGS["async_handoff"]
SYNC = CONFIGS["handoff_crash"]

# guard-table rows (tests/spec/test_guards_decode.py reads them too): (action, config,
# state, request, message, expected request-0 fields or ("disabled", None))
_D = Req(st=RUNNING, d=WRITABLE, ep=1, dep=1)
CASES = [
    ("PrefillStepDispatch", AS, World(reqs=(Req(st=PREFILLING, p=WRITABLE),)), 0, 0, {"pstep": 1}),
    ("PrefillStepDispatch", SYNC, World(reqs=(Req(st=PREFILLING, p=WRITABLE),)), 0, 0, ("x", None)),
    (
        "PrefillStepComplete",
        AS,
        World(reqs=(Req(st=PREFILLING, p=WRITABLE, pstep=1),)),
        0,
        0,
        {"pstep": 0, "st": RUNNING},
    ),
    ("PrefillStepComplete", AS, World(reqs=(Req(st=RUNNING, p=WRITABLE),)), 0, 0, ("x", None)),
    ("DecodeStepDispatch", AS, World(reqs=(_D,)), 0, 0, {"dstep": 1}),
    ("DecodeStepDispatch", AS, World(reqs=(_D._replace(st=CANCELLED),)), 0, 0, ("x", None)),
    ("DecodeStepComplete", AS, World(reqs=(_D._replace(dstep=1),)), 0, 0, {"dstep": 0}),
    ("DecodeStepComplete", AS, World(reqs=(_D,), d_up=False), 0, 0, ("x", None)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c[0]))
def test_guard_table(case: tuple[Any, ...]) -> None:
    name, c, w, i, arg, expected = case
    s = apply(w, c, frozenset(), name, i, arg)
    if isinstance(expected, tuple):
        assert isinstance(s, Refused) and s.prop is expected[1], (name, s)
    else:
        assert isinstance(s, World), (name, s)
        for f, v in expected.items():
            assert getattr(s.reqs[i], f) == v, (name, f)


def _w(**f: int) -> World:
    return World(reqs=(Req(**f),))  # type: ignore[arg-type]


def _go(name: str, w: World) -> World:
    s = apply(w, AS, frozenset(), name, 0, 0)
    assert isinstance(s, World), f"{name} refused: {s}"
    return s


def _refused(name: str, w: World, m: frozenset[str] = frozenset()) -> str | None:
    s = apply(w, AS, m, name, 0, 0)
    assert isinstance(s, Refused), f"{name} should be refused, got {s}"
    return s.prop


def test_the_prefill_forward_pass_is_dispatched_then_completes() -> None:
    w = _w(st=PREFILLING, p=WRITABLE)
    assert _refused("PrefillRun", w) is None  # the synchronous step is off
    s = _go("PrefillStepDispatch", w)
    assert s.reqs[0].pstep == 1 and s.reqs[0].st == PREFILLING
    assert _refused("PrefillStepDispatch", s) is None  # one step in flight at a time
    t = _go("PrefillStepComplete", s)
    assert t.reqs[0].pstep == 0 and t.reqs[0].st == RUNNING


def test_decode_steps_are_dispatched_then_complete() -> None:
    w = _w(st=RUNNING, d=WRITABLE, ep=1, dep=1)
    assert _refused("DecodeStep", w) is None
    s = _go("DecodeStepDispatch", w)
    assert s.reqs[0].dstep == 1
    assert _go("DecodeStepComplete", s).reqs[0].dstep == 0


@pytest.mark.parametrize(
    ("name", "fields", "prop"),
    [
        ("PrefillFinish", {"st": RUNNING, "p": WRITABLE, "pstep": 1}, "NoReuseUnderIO"),
        ("PrefillPreempt", {"st": RUNNING, "p": WRITABLE, "pstep": 1}, "NoReuseUnderIO"),
        ("PrefillFreeze", {"st": RUNNING, "p": WRITABLE, "pstep": 1}, "FrozenSnapshot"),
        ("PrefillQuiesce", {"st": CANCELLED, "p": WRITABLE, "pstep": 1}, "NoReuseUnderIO"),
        ("DecodeFinish", {"st": RUNNING, "d": WRITABLE, "dstep": 1}, "NoReuseUnderIO"),
        ("DecodeAbort", {"st": CANCELLED, "d": WRITABLE, "dstep": 1}, "NoReuseUnderIO"),
    ],
)
def test_nothing_frees_or_freezes_blocks_under_a_step(
    name: str, fields: dict[str, int], prop: str
) -> None:
    w = _w(**fields)
    assert _refused(name, w) == prop
    done = w._replace(reqs=(w.reqs[0]._replace(pstep=0, dstep=0),))
    assert isinstance(apply(done, AS, frozenset(), name, 0, 0), World)  # after completion


def test_a_cancel_is_deferred_until_the_step_completes() -> None:
    s = _go("ClientCancel", _w(st=RUNNING, d=WRITABLE, dstep=1, ep=1, dep=1))
    assert s.reqs[0].st == CANCELLED and s.reqs[0].d == WRITABLE
    t = _go("DecodeStepComplete", s)
    assert t.reqs[0].st == CANCELLED  # the output is discarded; the status stays
    assert _go("DecodeAbort", t).reqs[0].d == NONE


def test_a_crash_takes_the_worker_s_step_with_it() -> None:
    c = AS.__class__(**{**AS.__dict__, "name": "x", "faults": 1, "fault_kinds": {"crash"}})
    w = _w(st=RUNNING, p=WRITABLE, pstep=1)
    s = apply(w, c, frozenset(), "EnvCrash", 0, 0)
    assert isinstance(s, World) and s.reqs[0].pstep == 0 and no_reuse_under_io(s, c)


def test_the_properties_read_the_step_registers() -> None:
    assert not no_reuse_under_io(_w(st=FINISHED, pstep=1), AS)
    assert not no_reuse_under_io(_w(st=CANCELLED, dstep=1), AS)
    assert no_reuse_under_io(_w(st=RUNNING, p=WRITABLE, pstep=1), AS)
    assert not frozen_snapshot(_w(st=RUNNING, p=COMPLETE, ps=AWAIT_READY, ep=1, pstep=1), AS)
    assert frozen_snapshot(_w(st=RUNNING, p=WRITABLE, ps=IDLE, pstep=1), AS)
    assert not quiescent_terminal(_w(st=FINISHED, pstep=1), AS)


def test_without_the_switch_nothing_changes() -> None:
    w = _w(st=PREFILLING, p=WRITABLE)
    assert isinstance(apply(w, SYNC, frozenset(), "PrefillRun", 0, 0), World)
    assert isinstance(apply(w, SYNC, frozenset(), "PrefillStepDispatch", 0, 0), Refused)


def test_the_config_holds_every_property() -> None:
    r = check_config("async_handoff")
    assert not r.violations
    seen = {lb[0] for lb in r.graph.lab}
    assert {"PrefillStepComplete", "DecodeStepDispatch", "DecodeStepComplete"} <= seen


@pytest.mark.parametrize(
    "name",
    ["free_with_step_in_flight", "freeze_with_step_in_flight", "preempt_with_step_in_flight"],
)
def test_each_mutant_is_caught_with_its_property(name: str) -> None:
    r = check_mutant(name)
    assert r.caught, name


def test_the_decode_side_free_breaks_no_reuse_under_io() -> None:
    w = _w(st=CANCELLED, d=WRITABLE, dstep=1, ep=1, dep=1)
    s = apply(w, AS, frozenset({"free_with_step_in_flight"}), "DecodeAbort", 0, 0)
    assert isinstance(s, World) and not no_reuse_under_io(s, AS)
