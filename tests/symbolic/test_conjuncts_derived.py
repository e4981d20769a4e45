"""INVARIANTS.md's strengthening conjuncts in z3 are the spec's own predicates, traced
(issue #32, "one definition"): ``tracer.predicate.conj_*`` runs each predicate of
``spec/invariants`` on symbolic state, split by the scope the induction quantifies it
over (global; one request; one request and one message slot ``(epoch, idx)``).

The net for deleting the hand-written copies (``invariants.STRENGTHENING``): z3 proves,
conjunct by conjunct, that the traced scope equals the hand-written one for every
state of the unbounded model (every field, message count and config value, at every
src_tp the induction uses), at a request and a symbolic slot; and, for the request
and global conjuncts that BMC reads, for every state of a finite encoding, request by
request. The one part a Python predicate cannot say is kept by hand (``Z3_ONLY``: no
message count is negative)."""

from __future__ import annotations

from typing import Any

import pytest
import z3

from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.finite import FCtx
from model_checks.symbolic.invariants import KINDS, STRENGTHENING, Conj
from model_checks.symbolic.tracer.predicate import conj_glob, conj_req, conj_slot
from model_checks.symbolic.tracer.symstate import TraceError
from model_checks.symbolic.unbounded import REQ, UModel
from spec.config import CONFIGS
from spec.invariants import INVARIANTS, Conjunct
from spec.state import M_ACK, World

TPS = (1, 2, pytest.param(3, marks=pytest.mark.nightly), pytest.param(4, marks=pytest.mark.nightly))
FINITE = (
    "handoff_crash",
    pytest.param("async_handoff", marks=pytest.mark.nightly),
    pytest.param("handoff_retract", marks=pytest.mark.nightly),
    pytest.param("handoff_tp2to1", marks=pytest.mark.nightly),
)


def derived(j: Conjunct) -> Conj:
    """The conjunct ``j`` traced from its spec predicate."""
    if j.scope == "global":
        return Conj(j.name, "glob", j.doc, glob=conj_glob(j.pred))
    if j.scope == "request":
        return Conj(j.name, "req", j.doc, req=conj_req(j.pred))
    return Conj(j.name, "slot", j.doc, slot=conj_slot(j.pred, KINDS))


def _nonneg(r: Any, e: Any, i: Any) -> Any:
    """What the Python predicates cannot say: no message count is negative (MsgOK's)."""
    return z3.And(*(r.net.count(k, e, i) >= 0 for k in KINDS))


def _differ(a: Any, b: Any, facts: list[Any]) -> Any:
    """A model where ``a`` and ``b`` differ under ``facts``, or None (proved equal)."""
    s = z3.Solver()
    s.add(*facts)
    s.add(
        z3.Xor(
            z3.BoolVal(a) if isinstance(a, bool) else a, z3.BoolVal(b) if isinstance(b, bool) else b
        )
    )
    r = s.check()
    assert r != z3.unknown, r
    return s.model() if r == z3.sat else None


@pytest.mark.parametrize("tp", TPS)
def test_every_traced_conjunct_equals_the_hand_written_one(tp: int) -> None:
    m = UModel(tp)
    s = m.state("s")
    r, e, i = z3.Const("r", REQ), z3.Int("e"), z3.Int("i")
    x, v = m.ctx(s), m.view(s, r)
    facts = [f for _, f in m.param_facts]
    differ = []
    for name, j in INVARIANTS.items():
        hand, got = STRENGTHENING[name], derived(j)
        assert got.scope == hand.scope, name
        if hand.scope == "glob":
            assert hand.glob is not None and got.glob is not None
            a, b = hand.glob(x), got.glob(x)
        elif hand.scope == "req":
            assert hand.req is not None and got.req is not None
            a, b = hand.req(x, v), got.req(x, v)
        else:
            assert hand.slot is not None and got.slot is not None
            a, b = hand.slot(x, v, e, i), got.slot(x, v, e, i)
            if name == "MsgOK":
                b = z3.And(b, _nonneg(v, e, i))
        if _differ(a, b, facts) is not None:
            differ.append(name)
    assert differ == []


def test_the_count_clause_is_what_the_predicate_cannot_say() -> None:
    """Without the hand-kept clause MsgOK differs (a negative count); nothing else does."""
    m = UModel(2)
    s = m.state("s")
    r, e, i = z3.Const("r", REQ), z3.Int("e"), z3.Int("i")
    x, v = m.ctx(s), m.view(s, r)
    hand = STRENGTHENING["MsgOK"].slot
    assert hand is not None
    got = derived(INVARIANTS["MsgOK"]).slot
    assert got is not None
    model = _differ(hand(x, v, e, i), got(x, v, e, i), [f for _, f in m.param_facts])
    assert model is not None
    counts = [model.eval(v.net.count(k, e, i), model_completion=True).as_long() for k in KINDS]
    assert min(counts) < 0


@pytest.mark.parametrize("name", FINITE)
def test_request_conjuncts_equal_on_a_finite_encoding(name: str) -> None:
    """BMC reads the request and global conjuncts on the finite encodings."""
    enc = Encoding(CONFIGS[name])
    s = enc.state("s")
    x = FCtx(enc, s)
    differ = []
    for cname, j in INVARIANTS.items():
        hand, got = STRENGTHENING[cname], derived(j)
        if hand.glob is not None and got.glob is not None:
            pairs = [(hand.glob(x), got.glob(x))]
        elif hand.req is not None and got.req is not None:
            views = [enc.view(s, k) for k in range(enc.c.n_reqs)]
            pairs = [(hand.req(x, v), got.req(x, v)) for v in views]
        else:
            continue
        if any(_differ(a, b, []) is not None for a, b in pairs):
            differ.append(cname)
    assert differ == []


def _ack_of_a_request(w: World, c: object) -> bool:
    """A slot-shaped predicate with a request-level clause (not a conjunction over the
    request's messages): the split would lose the clause, so tracing refuses it."""
    return all(r.ep >= 1 and all(k != M_ACK for k in r.net) for r in w.reqs)


def test_a_slot_conjunct_with_a_request_part_fails_loudly() -> None:
    m = UModel(1)
    s = m.state("s")
    r = z3.Const("r", REQ)
    with pytest.raises(TraceError, match="request part"):
        conj_slot(_ack_of_a_request, KINDS)(m.ctx(s), m.view(s, r), z3.Int("e"), z3.Int("i"))
