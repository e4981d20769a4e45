"""Restarts in the spec (spec/behaviours/restarts.py): a crashed worker comes back as a
new incarnation with empty pools; messages of an older incarnation are fenced."""

from __future__ import annotations

import pytest

from model_checks.explicit.explore import explore
from spec.actions import apply, decode_args, encode_args
from spec.behaviours.restarts import older_incarnation
from spec.common import Refused
from spec.config import CONFIGS, Config
from spec.properties import no_reuse_under_io
from spec.state import (
    AWAIT_ACK,
    AWAIT_READY,
    COMPLETE,
    FAILED,
    M_ACK,
    M_CHUNK,
    M_HANDOFF,
    M_READY,
    NONE,
    RUNNING,
    SENDING,
    WRITABLE,
    Req,
    World,
    msg,
    msg_epoch,
    msg_inc,
    msg_kind,
)
from spec.steps import stale_changes_nothing

RS = CONFIGS["restart_handoff"]
NO = frozenset[str]()


def _w(r: Req, **g: object) -> World:
    return World(reqs=(r,), **g)  # type: ignore[arg-type]


def test_config_refuses_restarts_without_crashes() -> None:
    with pytest.raises(ValueError, match="restarts without"):
        Config("x", "x", faults=1, fault_kinds=frozenset({"lose"}), restarts=1)
    with pytest.raises(ValueError, match="restarts=4"):
        Config("x", "x", faults=1, fault_kinds=frozenset({"crash"}), restarts=4)


def test_restart_brings_a_new_incarnation_with_empty_pools() -> None:
    w = RS.initial()
    for name, i, arg in (("PrefillAdmit", 0, 0), ("PrefillRun", 0, 0)):
        w = apply(w, RS, NO, name, i, arg)  # type: ignore[assignment]
    w = apply(w, RS, NO, "EnvCrash", 0, 1)  # type: ignore[assignment]
    assert isinstance(w, World) and not w.d_up
    w2 = apply(w, RS, NO, "EnvRestart", 0, 1)
    assert isinstance(w2, World) and w2.d_up and w2.d_inc == 1 and w2.p_inc == 0
    assert w2.reqs[0].d == NONE and not w2.pfx and w2.pfx_ref == 0
    # the new incarnation's Ready carries its incarnation
    w3 = apply(w2, RS, NO, "PrefillFreeze", 0, 0)
    assert isinstance(w3, World)
    ho = w3.reqs[0].net[0]
    assert msg_kind(ho) == M_HANDOFF and msg_inc(ho) == 0  # prefill never restarted
    w4 = apply(w3, RS, NO, "DecodeReserve", 0, ho)
    assert isinstance(w4, World)
    (ready,) = w4.reqs[0].net
    assert msg_kind(ready) == M_READY and msg_inc(ready) == 1
    w5 = apply(w4, RS, NO, "PrefillRecvReady", 0, ready)
    assert isinstance(w5, World) and w5.reqs[0].rinc == 1
    w6 = apply(w5, RS, NO, "PrefillSendChunk", 0, 0)
    assert isinstance(w6, World)
    (chunk,) = w6.reqs[0].net
    assert msg_kind(chunk) == M_CHUNK and msg_inc(chunk) == 1  # the new registration


# a running request frozen for epoch 1, bound to decode incarnation 0, decode restarted
SENT_TO_DEAD = Req(st=RUNNING, p=COMPLETE, ep=1, dep=1, ps=SENDING, net=(msg(M_CHUNK, 1, 0),))
READY_OF_DEAD = Req(st=RUNNING, p=COMPLETE, ep=1, dep=1, ps=AWAIT_READY, net=(msg(M_READY, 1),))
ACK_OF_DEAD = Req(st=RUNNING, p=COMPLETE, ep=1, dep=1, ps=AWAIT_ACK, net=(msg(M_ACK, 1),))


@pytest.mark.parametrize(
    "r,name,refusal,discard",
    [
        (READY_OF_DEAD, "PrefillRecvReady", "Fencing", "PrefillDiscard"),
        (ACK_OF_DEAD, "PrefillRelease", "Fencing", "PrefillDiscard"),
        (SENT_TO_DEAD, "DecodeReceiveChunk", None, None),
    ],
)
def test_a_dead_decode_incarnations_message_changes_nothing(
    r: Req, name: str, refusal: str | None, discard: str | None
) -> None:
    w = _w(r, d_inc=1)
    code = r.net[0]
    res = apply(w, RS, NO, name, 0, code)
    if refusal is not None:
        assert isinstance(res, Refused) and res.prop == refusal
        assert discard is not None
        res = apply(w, RS, NO, discard, 0, code)
    assert isinstance(res, World)
    assert res.reqs[0] == r._replace(net=())  # consumed, nothing else changed
    assert stale_changes_nothing(w, name if refusal is None else discard, 0, code, res, RS)  # type: ignore[arg-type]


def test_a_dead_prefill_incarnations_handoff_is_discarded() -> None:
    r = Req(st=RUNNING, net=(msg(M_HANDOFF, 1),))
    w = _w(r, p_inc=1)
    res = apply(w, RS, NO, "DecodeReserve", 0, r.net[0])
    assert isinstance(res, Refused) and res.prop == "Fencing"
    assert isinstance(apply(w, RS, NO, "DecodeReject", 0, r.net[0]), Refused)
    res2 = apply(w, RS, NO, "DecodeDiscard", 0, r.net[0])
    assert isinstance(res2, World) and res2.reqs[0] == r._replace(net=())


def test_the_mutants_take_the_dead_incarnations_word() -> None:
    w = _w(READY_OF_DEAD, d_inc=1)
    code = READY_OF_DEAD.net[0]
    bad = apply(w, RS, frozenset({"stale_incarnation_accepted"}), "PrefillRecvReady", 0, code)
    assert isinstance(bad, World) and bad.reqs[0].ps == SENDING
    assert not stale_changes_nothing(w, "PrefillRecvReady", 0, code, bad, RS)
    w = _w(SENT_TO_DEAD, d_inc=1)
    code = SENT_TO_DEAD.net[0]
    assert no_reuse_under_io(w, RS)  # a write to a dead registration: no live block
    bad = apply(w, RS, frozenset({"restart_keeps_pool"}), "DecodeReceiveChunk", 0, code)
    assert isinstance(bad, World) and not no_reuse_under_io(bad, RS)


def test_without_restarts_a_write_with_no_held_destination_is_still_a_breach() -> None:
    assert not no_reuse_under_io(_w(SENT_TO_DEAD), RS)


def test_trace_args_name_the_incarnation_only_when_there_is_one() -> None:
    code = msg(M_READY, 1, 0, 1)
    args = encode_args("PrefillRecvReady", 0, code)
    assert args["inc"] == 1 and decode_args("PrefillRecvReady", args) == (0, code)
    assert "inc" not in encode_args("PrefillRecvReady", 0, msg(M_READY, 1))
    assert msg_epoch(code) == 1


def test_restart_world_exercises_fencing_and_recovery() -> None:
    """In restart_handoff a message of an older incarnation is in flight in some reachable
    state (fencing is not vacuous), and a request hands off to the new decode incarnation
    and commits there."""
    g = explore(RS, NO)
    stale = recovered = False
    for w in g.states:
        for r in w.reqs:
            for code in r.net:
                stale = stale or older_incarnation(w, code)
            recovered = recovered or (w.d_inc == 1 and r.d == WRITABLE and r.st == RUNNING)
    assert stale and recovered


def test_second_decode_crash_clause_is_reached() -> None:
    """crash_both explores a decode crash of a running request whose only complete copy was
    on decode (after prefill's crash): that clause of the crash fates fails it."""
    c = CONFIGS["crash_both"]
    g = explore(c, NO)
    hits = 0
    for k, (name, _i, arg) in enumerate(g.lab):
        if name != "EnvCrash" or arg != 1:
            continue
        pre, post = g.states[g.src[k]], g.states[g.dst[k]]
        for a, b in zip(pre.reqs, post.reqs, strict=True):
            if a.st == RUNNING and a.d == COMPLETE and a.p == NONE and a.h == NONE:
                assert b.st == FAILED
                hits += 1
    assert hits > 0
