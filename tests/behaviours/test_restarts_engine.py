"""Restarts on the torch engine (refimpl/engine/restarts.py): incarnations on the wire, the
fence of an older incarnation, empty pools after a restart, a fresh handoff after it."""

from __future__ import annotations

import pytest

from model_checks.explicit.trace import replay
from refimpl.engine import Engine
from refimpl.errors import OwnershipError
from spec.config import CONFIGS

RS = CONFIGS["restart_handoff"]


def s(action: str, **args: object) -> dict[str, object]:
    return {"action": action, "args": args}


def m(action: str, kind: str, epoch: int = 1, idx: int = 0, **more: int) -> dict[str, object]:
    return s(action, req=0, msg=kind, epoch=epoch, idx=idx, **more)


START = [s("PrefillAdmit", req=0), s("PrefillRun", req=0), s("PrefillFreeze", req=0)]


def run(steps: list[dict[str, object]]) -> Engine:
    """The steps on the engine; after each its abstract state equals the spec's."""
    worlds = replay(RS, frozenset(), steps)
    e = Engine(RS)
    for k, st in enumerate(steps):
        e.step(st["action"], st["args"])  # type: ignore[arg-type]
        assert e.abstract() == worlds[k + 1], (k, st)
    return e


def test_a_dead_decodes_ready_is_refused_then_discarded() -> None:
    steps = [*START, m("DecodeReserve", "Handoff"), s("EnvCrash", worker="decode")]
    e = run([*steps, s("EnvRestart", worker="decode")])
    assert e.d_inc == 1 and e.D.alloc.num_free == e.D.alloc.capacity
    before = e.fingerprint()
    with pytest.raises(OwnershipError) as err:
        e.step("PrefillRecvReady", m("PrefillRecvReady", "Ready")["args"])  # type: ignore[arg-type]
    assert err.value.prop == "Fencing" and e.fingerprint() == before
    run([*steps, s("EnvRestart", worker="decode"), m("PrefillDiscard", "Ready")])


def test_a_write_to_a_dead_registration_lands_nowhere() -> None:
    steps = [*START, m("DecodeReserve", "Handoff"), m("PrefillRecvReady", "Ready")]
    steps += [s("EnvCrash", worker="decode"), s("EnvRestart", worker="decode")]
    steps += [s("PrefillSendChunk", req=0), m("DecodeReceiveChunk", "Chunk")]
    e = run(steps)
    assert e.D.alloc.num_free == e.D.alloc.capacity and e.damaged() == []
    e.check_integrity()


def test_a_request_that_had_not_frozen_hands_off_to_the_new_incarnation() -> None:
    steps = [s("PrefillAdmit", req=0), s("PrefillRun", req=0), s("EnvCrash", worker="decode")]
    steps += [s("EnvRestart", worker="decode"), s("PrefillFreeze", req=0)]
    steps += [m("DecodeReserve", "Handoff"), m("PrefillRecvReady", "Ready", inc=1)]
    steps += [s("PrefillSendChunk", req=0), m("DecodeReceiveChunk", "Chunk", inc=1)]
    steps += [s("PrefillSendChunk", req=0), m("DecodeReceiveDone", "RankDone")]
    steps += [s("DecodeValidate", req=0), s("DecodeCommit", req=0)]
    steps += [m("PrefillRelease", "Ack", inc=1), s("DecodeFinish", req=0)]
    e = run(steps)
    assert e.damaged() == [] and e.abstract().reqs[0].st == 4  # finished
    e.check_integrity()


def test_a_step_naming_the_wrong_incarnation_finds_no_message() -> None:
    e = run([*START, m("DecodeReserve", "Handoff")])
    with pytest.raises(OwnershipError):
        e.step("PrefillRecvReady", m("PrefillRecvReady", "Ready", inc=1)["args"])  # type: ignore[arg-type]
