"""INVARIANTS.md's strengthening conjuncts in z3 are the spec's own predicates, traced
(issue #32, "one definition"): ``invariants.STRENGTHENING`` holds no formula of its own
but the one clause a Python predicate cannot say (``Z3_ONLY``), and
``tracer.predicate.conj_*`` splits each predicate of ``spec/invariants`` by the scope
the induction quantifies it over (global; one request; one request and one message
slot ``(epoch, idx)``).

The hand-written copies were deleted after z3 proved each traced conjunct equal to its
copy for every state of the unbounded model at src_tp 1..4 and, for the request and
global conjuncts, of four finite encodings (the commit that added this file).
``tests/explorer/test_invariants_spec.py`` evaluates the traced formulas on reachable
and perturbed states and compares them with the predicates, conjunct by conjunct."""

from __future__ import annotations

from typing import Any

import pytest
import z3

from model_checks.symbolic.invariants import KINDS, STRENGTHENING, Z3_ONLY, derived
from model_checks.symbolic.tracer import predicate as P
from model_checks.symbolic.tracer import symstate as S
from model_checks.symbolic.tracer.predicate import conj_glob, conj_req, conj_slot
from model_checks.symbolic.tracer.symstate import TraceError
from model_checks.symbolic.unbounded import REQ, UModel
from spec.invariants import INVARIANTS
from spec.state import M_ACK, World

SCOPE = {"global": "glob", "request": "req", "slot": "slot"}


def _setup(tp: int) -> tuple[Any, Any, Any, Any, list[Any]]:
    m = UModel(tp)
    s = m.state("s")
    r, e, i = z3.Const("r", REQ), z3.Int("e"), z3.Int("i")
    return m.ctx(s), m.view(s, r), e, i, [f for _, f in m.param_facts]


def _differ(a: Any, b: Any, facts: list[Any]) -> Any:
    """A model where ``a`` and ``b`` differ under ``facts``, or None (proved equal)."""
    s = z3.Solver()
    s.add(*facts, z3.Xor(z3.BoolVal(a) if isinstance(a, bool) else a, b))
    r = s.check()
    assert r != z3.unknown, r
    return s.model() if r == z3.sat else None


@pytest.mark.parametrize("tp", [2, pytest.param(4, marks=pytest.mark.nightly)])
def test_each_conjunct_is_its_spec_predicate_traced(tp: int) -> None:
    """Every z3 conjunct equals its spec predicate traced afresh (and the ``Z3_ONLY``
    clause): nothing else is said in z3 about any of them."""
    x, v, e, i, facts = _setup(tp)
    assert list(STRENGTHENING) == list(INVARIANTS)
    for name, j in INVARIANTS.items():
        z = STRENGTHENING[name]
        assert z.scope == SCOPE[j.scope], name
        if z.glob is not None:
            a, b = z.glob(x), conj_glob(j.pred)(x)
        elif z.req is not None:
            a, b = z.req(x, v), conj_req(j.pred)(x, v)
        else:
            assert z.slot is not None
            a, b = z.slot(x, v, e, i), conj_slot(j.pred, KINDS)(x, v, e, i)
            if name in Z3_ONLY:
                b = z3.And(b, Z3_ONLY[name](x, v, e, i))
        assert _differ(a, b, facts) is None, name


def _flat(got: list[tuple[list[Any], Any]]) -> Any:
    """The value of a predicate's paths as their plain disjunction (each path's
    condition and outcome)."""
    return z3.Or(*(z3.And(*lits, S.raw(v)) for lits, v in got if v is not None), False)


def test_the_decision_tree_is_the_disjunction_of_the_paths(monkeypatch: Any) -> None:
    """``conj_*`` build a predicate's value as the decision tree of its paths (compact:
    what follows a fork is shared); it says what the disjunction of the paths says."""
    x, v, e, i, facts = _setup(2)
    tree = {n: _at(z, x, v, e, i) for n, z in STRENGTHENING.items()}
    monkeypatch.setattr(P, "_term", _flat)
    for name, j in INVARIANTS.items():
        flat = _at(derived(j), x, v, e, i)
        assert _differ(tree[name], flat, facts) is None, name


def _at(z: Any, x: Any, v: Any, e: Any, i: Any) -> Any:
    if z.glob is not None:
        return z.glob(x)
    return z.req(x, v) if z.req is not None else z.slot(x, v, e, i)


def test_the_hand_kept_clause_is_what_the_predicate_cannot_say() -> None:
    """``Z3_ONLY`` is not redundant: MsgOK traced alone admits a negative count, which
    no tuple of messages has; the induction needs the clause (a take lowers a count)."""
    assert set(Z3_ONLY) == {"MsgOK"}
    x, v, e, i, facts = _setup(2)
    got = conj_slot(INVARIANTS["MsgOK"].pred, KINDS)(x, v, e, i)
    full = STRENGTHENING["MsgOK"].slot
    assert full is not None
    model = _differ(full(x, v, e, i), got, facts)
    assert model is not None
    counts = [model.eval(v.net.count(k, e, i), model_completion=True).as_long() for k in KINDS]
    assert min(counts) < 0


def _no_ack_and_an_epoch(w: World, c: object) -> bool:
    """A slot-shaped predicate with a request-level clause (``ep >= 1`` outside any
    message's clause): the split would lose it, so tracing refuses it."""
    return all(r.ep >= 1 and all(k != M_ACK for k in r.net) for r in w.reqs)


def test_a_slot_conjunct_with_a_request_part_fails_loudly() -> None:
    x, v, e, i, _ = _setup(1)
    with pytest.raises(TraceError, match="request part"):
        conj_slot(_no_ack_and_an_epoch, KINDS)(x, v, e, i)


def _reads_messages(w: World, c: object) -> bool:
    return all(not r.net for r in w.reqs)


def test_a_request_conjunct_that_reads_messages_fails_loudly() -> None:
    x, v, _, _, _ = _setup(1)
    with pytest.raises(TraceError, match="messages"):
        conj_req(_reads_messages)(x, v)
