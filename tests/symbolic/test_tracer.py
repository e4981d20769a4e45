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
    UNENCODED,
    WORKER,
    encodable,
)
from model_checks.symbolic.core import Msg
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.finite import FCtx, FState
from model_checks.symbolic.tracer import symstate as S
from model_checks.symbolic.tracer import trace as T
from spec.actions import ACTIONS
from spec.config import CONFIGS
from spec.state import COMPLETE, M_ACK, PREFILLING, RUNNING, WRITABLE, msg, msg_kind


def _setup(name: str = "handoff_tp2to1") -> tuple[Encoding, FState, FCtx]:
    enc = Encoding(CONFIGS[name])
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


def test_iterating_messages_is_refused() -> None:
    enc, s, _ = _setup()
    with pytest.raises(S.TraceError, match="iterated"):
        list(S.SymNet(enc.view(s, 0).net))


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


ENCODABLE = sorted(n for n, c in CONFIGS.items() if encodable(c))


def test_every_action_has_a_derived_encoding_or_is_named() -> None:
    """Each spec action is traced (PER_REQ, GLOBAL), the crash (WORKER), or named in
    UNENCODED with the switch that leaves it out; nothing is mirrored by hand."""
    derived = set(PER_REQ) | set(GLOBAL)
    assert set(ACTIONS) == derived | set(WORKER) | set(UNENCODED)
    assert not derived & set(UNENCODED)
    for fn in (*PER_REQ.values(), *GLOBAL_FNS.values()):
        assert fn.__module__ == T.__name__  # the traced function, no hand copy


@pytest.mark.parametrize("config", ENCODABLE)
def test_every_derived_action_traces_in_every_encodable_config(config: str) -> None:
    """No TraceError: every traced action (each message kind it takes) runs to a Rules
    in the config's finite encoding."""
    enc = Encoding(CONFIGS[config])
    s = enc.state("all")
    x = FCtx(enc, s)
    kinds = {msg_kind(code) for code in enc.codes}
    for name in PER_REQ:
        a = ACTIONS[name]
        for k in sorted(a.msgs & kinds) if a.arg == "msg" else [None]:
            T.trace(name, x, enc.view(s, 0), None if k is None else Msg(k, 1, 0))
    for name in GLOBAL:
        T.trace(name, x, None)
