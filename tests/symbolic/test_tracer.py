"""The tracer (model_checks/symbolic/tracer/trace.py): the spec's Python actions, run on symbolic
stand-ins, give the ``Rules`` the encodings consume; checked on the one-line actions and
on the path enumeration itself."""

from __future__ import annotations

from typing import Any

import pytest
import z3

from model_checks.symbolic.actions import (
    GLOBAL,
    GLOBAL_FNS,
    PER_REQ,
    WORKER,
)
from model_checks.symbolic.bmc import shared_encoding
from model_checks.symbolic.core import Msg, NetOp
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.finite import FCtx, FState
from model_checks.symbolic.tracer import predicate as P
from model_checks.symbolic.tracer import symstate as S
from model_checks.symbolic.tracer import trace as T
from model_checks.symbolic.tracer import worker as W
from spec.actions import ACTIONS
from spec.config import CONFIGS
from spec.state import (
    COMPLETE,
    M_ACK,
    PREFILLING,
    RUNNING,
    TO_PREFILL,
    WRITABLE,
    msg,
    msg_kind,
)

# Each test reads its config's one encoding (shared_encoding: tracing it is 2-3 CPU s),
# in that encoding's xdist group (tests/conftest.py by_encoding): handoff_tp2to1's unless
# the test is parametrized by its config.
pytestmark = pytest.mark.by_encoding("handoff_tp2to1")


def _setup(name: str = "handoff_tp2to1") -> tuple[Encoding, FState, FCtx]:
    enc = shared_encoding(CONFIGS[name])
    s = enc.state("t")
    return enc, s, FCtx(enc, s)


def _valid(f: Any) -> bool:
    sol = z3.Solver()
    sol.add(z3.Not(f))
    return sol.check() == z3.unsat


def test_paths_enumerates_every_path_once() -> None:
    a, b = z3.Bools("a b")

    def run() -> int:
        if S.SymBool(a):
            return 1
        return 2 if S.SymBool(b) else 3

    got = [(str(z3.And(*lits)), out) for lits, out in T.paths(run)]
    assert [out for _, out in got] == [1, 2, 3]
    assert got[1][0] == "And(Not(a), b)"


def test_a_decided_condition_is_not_forked_again() -> None:
    x = z3.Int("x")

    def run() -> int:
        v = S.Sym(x)
        if v == 1:
            return 10 if v == 2 else 11  # folds: x == 1 on this path
        return 12 if v != 1 else 13  # folds: x != 1 on this path

    assert [out for _, out in T.paths(run)] == [11, 12]


def test_prefill_run_is_one_successor() -> None:
    enc, s, x = _setup()
    rules = T.trace("PrefillRun", x, enc.view(s, 0), None)
    cases = rules.cases()
    assert len(cases) == 1
    guard, go, _ = cases[0]
    assert go.req == {"st": RUNNING} and not go.glob and not go.net
    st, p, up = s[("r", 0, "st")], s[("r", 0, "p")], s[("g", "p_up")]
    assert _valid(guard == z3.And(up, st == PREFILLING, p == WRITABLE))


def test_prefill_admit_names_its_refusal() -> None:
    enc, s, x = _setup()
    rules = T.trace("PrefillAdmit", x, enc.view(s, 0), None)
    labels = {b.label for b in rules.branches}
    assert labels == {"go", "refuse CapacityRefcount"}


def test_a_message_action_takes_its_message() -> None:
    enc, s, x = _setup()
    code = msg(M_ACK, 1)
    rules = T.trace("PrefillRelease", x, enc.view(s, 0), Msg(M_ACK, 1, 0))
    (go,) = [b.go for b in rules.branches if b.go is not None]
    assert go.req["p"] == 0 and [op.op for op in go.net] == ["take"]
    assert code in enc.codes
    assert any(b.label == "refuse Fencing" for b in rules.branches)


def test_config_switches_specialise_away() -> None:
    """PrefillRun tests ``c.async_steps`` first: on in async_handoff, so never enabled."""
    enc, s, x = _setup("async_handoff")
    assert T.trace("PrefillRun", x, enc.view(s, 0), None).cases() == []


def test_global_action_changes_globals_only() -> None:
    enc, s, x = _setup("prefix_share")
    (case,) = T.trace("DecodeEvictPrefix", x, None).cases()
    assert case[1].glob == {"pfx": False} and not case[1].req


def test_reading_another_request_is_refused() -> None:
    with pytest.raises(S.TraceError, match="another request"):
        S.OTHERS.st  # noqa: B018


def test_iterating_changed_messages_is_refused() -> None:
    """A request's messages iterate only as they were, one stand-in per kind (a filter
    by kind: the crash); after a change, iterating them is refused."""
    enc, s, _ = _setup()
    net = S.SymNet(enc.view(s, 0).net)
    with pytest.raises(S.TraceError, match="iterated"):
        list(net)  # outside a worker action's trace
    S.TRACE.kinds = True
    try:
        assert [k.kind for k in net] == list(range(16))
        with pytest.raises(S.TraceError, match="iterated"):
            list(net.then(NetOp("take", M_ACK, 1, 0)))
    finally:
        S.TRACE.kinds = False


def test_symbolic_value_as_key_is_refused() -> None:
    with pytest.raises(S.TraceError, match="dict key"):
        {S.Sym(z3.Int("x")): 1}


def test_a_bool_outside_a_trace_is_refused() -> None:
    with pytest.raises(S.TraceError, match="outside a trace"):
        bool(S.SymBool(z3.Bool("b")))


def test_the_spec_helpers_are_restored_after_a_trace() -> None:
    import spec.actions_prefill as P

    before = P.send
    enc, s, x = _setup()
    T.trace("PrefillFreeze", x, enc.view(s, 0), None)
    assert P.send is before and P.used_p is T.common.used_p


def test_unchanged_complete_is_not_an_effect() -> None:
    """A field the action does not write is no effect (only written fields are)."""
    enc, s, x = _setup()
    rules = T.trace("PrefillOffloadCopy", x, enc.view(s, 0), None)
    for _, go, _ in rules.cases():
        assert set(go.req) == {"hl"}
    assert COMPLETE  # the replica stays complete: not in the effect


ENCODABLE = sorted(CONFIGS)  # every world is in the finite encoding


def test_every_action_has_a_derived_encoding() -> None:
    """Each spec action is traced: of one request or global (PER_REQ, GLOBAL) or of a
    worker (WORKER: the crash, the restart); nothing is mirrored by hand. The actions
    without one are listed."""
    derived = set(PER_REQ) | set(GLOBAL)
    missing = sorted(set(ACTIONS) - derived - set(WORKER))
    assert missing == [], f"spec actions with no derived z3 encoding: {missing}"
    assert set(WORKER) == {"EnvCrash", "EnvRestart"} and not derived & set(WORKER)
    for fn in (*PER_REQ.values(), *GLOBAL_FNS.values()):
        assert fn.__module__ == T.__name__  # the traced function, no hand copy


def test_the_crash_is_traced_from_the_spec() -> None:
    """EnvCrash (a worker action) from spec.actions_env: guard and globals from a world of
    no request, the per-request map (and the kinds of messages kept) from one request."""
    enc, s, x = _setup("handoff_crash")
    cr = W.trace_worker("EnvCrash", x, 1)
    assert cr.glob.keys() == {"d_up", "pfx", "pfx_ref", "faults"}
    assert cr.glob["d_up"] is False and cr.glob["pfx_ref"] == 0
    assert cr.keep == frozenset(TO_PREFILL)
    ch = cr.per_req(enc.view(s, 0))
    assert ch["d"] == 0 and "st" in ch and "p" not in ch
    assert W.trace_worker("EnvCrash", x, 2).cond is False  # no such worker


def test_the_crash_empties_the_host_cache() -> None:
    """In a host-cache world the crash of prefill (host memory) drops the shared copy."""
    enc, s, x = _setup("pair_crash_host")
    cr = W.trace_worker("EnvCrash", x, 0)
    assert {"hc", "hc_hl", "hc_pin", "hc_late", "hc_bad"} <= cr.glob.keys()
    assert cr.per_req(enc.view(s, 1))["hk"] == 0


def test_the_restart_is_traced_from_the_spec() -> None:
    """EnvRestart (a worker action) from spec.behaviours.restarts: a crashed worker comes
    back as its next incarnation; no request changes; a stamped send carries it."""
    enc, s, x = _setup("restart_handoff")
    cr = W.trace_worker("EnvRestart", x, 1)
    assert cr.glob.keys() == {"d_up", "d_inc"} and cr.glob["d_up"] is True
    assert cr.per_req(enc.view(s, 0)) == {} and cr.keep == W.ALL_KINDS
    assert _valid(
        cr.cond == z3.And(z3.Not(s[("g", "d_up")]), s[("g", "p_inc")] + s[("g", "d_inc")] < 1)
    )
    rules = T.trace("PrefillFreeze", x, enc.view(s, 0), None)
    sends = [op for _, go, _ in rules.cases() for op in go.net if op.op == "send"]
    assert sends and all(op.inc is s[("g", "p_inc")] for op in sends)  # the sender's


def test_a_property_part_is_traced_from_the_spec() -> None:
    """host_published_whole (PublishAfterCommit's host-cache part) and turns_kept
    (NothingLost's turn part) as z3 terms, equal to their meaning."""
    enc, s, x = _setup("host_cache_store")
    from spec.behaviours.host_cache import host_published_whole
    from spec.behaviours.turns import turns_kept

    hc, hl = s[("g", "hc")], s[("g", "hc_hl")]
    got = P.over_reqs(host_published_whole)(x)
    assert _valid(got == z3.Or(hc != COMPLETE, hl == enc.c.blocks))
    enc, s, x = _setup("turns_append")
    tn, d = s[("r", 0, "tn")], s[("r", 0, "d")]
    got = P.per_req(turns_kept)(x, enc.view(s, 0))
    assert _valid(got == z3.Or(tn == 0, d == WRITABLE))


@pytest.mark.parametrize("config", ["handoff_tp2to1", "host_cache_warm", "identity_prefix"])
def test_which_transition_predicates_bmc_traces(config: str) -> None:
    """The transition predicates of spec/steps.py that read the two states only are
    traced for BMC (whole_reload: NoPartialUse of a load); those that read the action,
    or more than the tracer follows, stay the explorer's (pinned here, so a change shows)."""
    from spec.steps import STEP_PREDS

    enc = shared_encoding(CONFIGS[config])
    x0, x1 = FCtx(enc, enc.state("a")), FCtx(enc, enc.state("b"))
    traced = set()
    for _, fn in STEP_PREDS:
        try:
            P.step_part(fn)(x0, x1)
        except S.TraceError:
            continue
        traced.add(fn.__name__)
    identity = CONFIGS[config].identity
    assert traced == {"whole_reload"} | (set() if identity else {"sent_staged"})


def test_a_part_over_every_request_needs_its_requests() -> None:
    """Unbounded (no fixed requests), a part over every request folds or fails loudly."""
    from spec.behaviours.host_cache import host_pins_exact

    enc, s, x = _setup()
    x.views = lambda: None  # type: ignore[method-assign]
    assert P.over_reqs(lambda w, c: host_pins_exact(w))(x) is True  # no host cache here


@pytest.mark.parametrize("config", ENCODABLE)
def test_every_derived_action_traces_in_every_encodable_config(config: str) -> None:
    """No TraceError: every traced action (each message kind it takes) runs to a Rules
    in the config's finite encoding."""
    enc = shared_encoding(CONFIGS[config])
    s = enc.state("all")
    x = FCtx(enc, s)
    kinds = {msg_kind(code) for code in enc.codes}
    for name in PER_REQ:
        a = ACTIONS[name]
        for k in sorted(a.msgs & kinds) if a.arg == "msg" else [None]:
            T.trace(name, x, enc.view(s, 0), None if k is None else Msg(k, 1, 0))
    for name in GLOBAL:
        T.trace(name, x, None)
    workers = ("EnvCrash",) if "crash" in enc.c.fault_kinds else ()
    for name in (*workers, "EnvRestart") if enc.c.restarts else workers:
        for worker in (0, 1):
            cr = W.trace_worker(name, x, worker)
            for i in range(enc.c.n_reqs):
                cr.per_req(enc.view(s, i))


def test_a_step_that_changes_another_request_is_traced_on_every_request() -> None:
    """``slot_reused_unfenced``'s DecodeReceiveDone reads the other requests (which holds
    the slot) and counts a late RankDone for the holder: traced again on every request,
    its successor changes the holder (``Go.others``), and z3's transition from that state
    is the spec's step, the holder's change included (and not the step without it)."""
    from model_checks.symbolic.finite import Inst
    from spec.actions import apply
    from spec.state import M_DONE
    from tests.behaviours.test_slots_guards import HOLDER, LATE, SL
    from tests.spec.spec_helpers import W as World2

    m = frozenset({"slot_reused_unfenced"})
    enc = Encoding(SL, m, instances=False)  # the variables only: one action's relation
    s, t = enc.state("pre"), enc.state("post")
    late = Msg(M_DONE, 1, 0)
    rules = PER_REQ["DecodeReceiveDone"](FCtx(enc, s), enc.view(s, 0), late)
    held = [b.go.others for b in rules.branches if b.go is not None and b.go.others]
    assert held and all(set(o) == {1} and set(o[1].req) == {"rmask", "g"} for o in held)
    w, code = World2(LATE, HOLDER), msg(M_DONE, 1, 0)
    w2 = apply(w, SL, m, "DecodeReceiveDone", 0, code)
    assert isinstance(w2, tuple) and w2.reqs[1].rmask == 1
    step = enc.action(Inst("DecodeReceiveDone", 0, code), s, t)
    for succ, want in ((w2, True), (w2._replace(reqs=(w2.reqs[0], HOLDER)), False)):
        sol = z3.Solver()
        sol.add(step, enc.is_world(s, w), enc.is_world(t, succ))
        assert (sol.check() == z3.sat) == want
    plain = Encoding(SL, instances=False)  # the spec without the mutant reads no other request
    rules = PER_REQ["DecodeReceiveDone"](FCtx(plain, s), plain.view(s, 0), late)
    assert not any(b.go.others for b in rules.branches if b.go is not None)
