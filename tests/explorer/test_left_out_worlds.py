"""The derived worlds (spec/behaviours/worlds.py, issue #25 item 4). ``reject_dup``, the small
variant of ``reject_retry``, holds the bug a rejection that does not fence its epoch
(``reject_unfenced``), which no other pinned world reaches; the correct ``DecodeReject``
fences the rejected epoch, so the duplicate Handoff is refused there. ``faults2_handoff``:
a fault budget of 2 on network faults and crashes, pinned in the deep suite."""

from __future__ import annotations

from model_checks.explicit.pin import load
from model_checks.explicit.runner import check_mutant
from model_checks.explicit.trace import TraceError, replay
from spec.actions import ACTIONS, decode_args
from spec.common import refuse
from spec.config import DEEP_SUITE, DEFAULT_SUITE, TOO_BIG, get_config
from spec.state import WRITABLE

MUTANT = "reject_unfenced"


def test_caught_in_reject_dup_at_its_pinned_length() -> None:
    r = check_mutant(MUTANT)
    assert r.caught and r.config == "reject_dup" and r.trace is not None
    assert r.trace_length == load()["mutants"][MUTANT]["trace_length"] == 19
    names = [st["action"] for st in r.trace.steps]
    # a rejection, then a reservation of the same request's same epoch: the copy
    k = names.index("DecodeReject")
    rej = r.trace.steps[k]
    later = [st for st in r.trace.steps[k + 1 :] if st["action"] == "DecodeReserve"]
    assert any(st["args"] == rej["args"] for st in later), "the rejected Handoff reserves"
    final = replay(get_config("reject_dup"), frozenset({MUTANT}), r.trace.steps)[-1]
    assert any(q.p == WRITABLE and q.d == WRITABLE for q in final.reqs)


def test_the_correct_rejection_fences_its_epoch() -> None:
    """The counterexample on the correct spec: its reservation of the rejected epoch is
    refused (Fencing), and the rejection raised decode's fence to that epoch."""
    c = get_config("reject_dup")
    steps = check_mutant(MUTANT).trace.steps  # type: ignore[union-attr]
    k = next(x for x, st in enumerate(steps) if st["action"] == "DecodeReject")
    worlds = replay(c, frozenset(), steps[: k + 1])
    i, arg = decode_args("DecodeReject", steps[k]["args"])
    assert worlds[-1].reqs[i].dep == (arg >> 8) & 0xFFFF  # dep = the rejected epoch
    try:
        replay(c, frozenset(), steps)
    except TraceError as exc:
        assert exc.step["action"] == "DecodeReserve" and exc.prop == "Fencing"
    else:
        raise AssertionError("the correct spec took the whole counterexample")
    # the same reservation on the pre-state of that step names Fencing
    x = next(x for x in range(k + 1, len(steps)) if steps[x]["action"] == "DecodeReserve")
    pre = replay(c, frozenset(), steps[:x])[-1]
    j, code = decode_args("DecodeReserve", steps[x]["args"])
    assert ACTIONS["DecodeReserve"].fn(pre, c, frozenset(), j, code) is refuse("Fencing")


def test_reject_dup_is_in_the_deep_suite_and_pinned() -> None:
    assert "reject_dup" in DEEP_SUITE and "reject_dup" not in DEFAULT_SUITE
    assert "reject_retry" in TOO_BIG
    pinned = load()["deep"]["reject_dup"]
    assert pinned["result"] == "holds" and pinned["distinct_states"] == 24796
    big, small = get_config("reject_retry"), get_config("reject_dup")
    assert (small.n_reqs, small.cap_d, small.fault_kinds) == (
        big.n_reqs,
        big.cap_d,
        big.fault_kinds,
    )


def test_faults2_handoff_is_a_two_fault_world_in_the_deep_suite() -> None:
    c = get_config("faults2_handoff")
    assert c.faults == 2 and {"lose", "duplicate", "crash"} <= c.fault_kinds
    assert not c.retract and c.max_attempts == 2
    assert "faults2_handoff" in DEEP_SUITE
    pinned = load()["deep"]["faults2_handoff"]
    assert pinned["result"] == "holds" and pinned["distinct_states"] == 29076
