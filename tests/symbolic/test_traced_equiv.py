"""Migration net (issue #32, item 4): every traced action equals its hand-written z3
mirror, for all field values within TypeOK: same enabledness, same refusal (by
property), same successor (every field and message count). Per action, in every
encodable config, and with each safety mutant on in its own config. Deleted with the
hand mirror it compares against."""

from __future__ import annotations

from typing import Any

import pytest
import z3

from model_checks.symbolic import actions_decode as D
from model_checks.symbolic import actions_prefill as P
from model_checks.symbolic import trace as T
from model_checks.symbolic.actions import encodable
from model_checks.symbolic.behaviours import async_steps as AS
from model_checks.symbolic.behaviours import decode_failure as DF
from model_checks.symbolic.behaviours import decode_ranks as DR
from model_checks.symbolic.behaviours import identity as ID
from model_checks.symbolic.behaviours import retract as RT
from model_checks.symbolic.bmc import UNENCODED_MUTANTS
from model_checks.symbolic.core import ITE, A, Msg, N, O, Rules
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.finite import FCtx
from model_checks.symbolic.invariants import _type_ok
from spec.actions import ACTIONS
from spec.config import CONFIGS
from spec.mutants import MUTANTS
from spec.state import msg_epoch, msg_idx, msg_kind

HAND = {
    n: fn
    for n in ACTIONS
    for mod in (P, D, AS, DF, RT, DR, ID)
    if (fn := getattr(mod, n, None)) is not None and n not in ("EnvCrash",)
}
ENC = sorted(n for n, c in CONFIGS.items() if encodable(c))
WORLDS = [(n, ()) for n in ENC] + [
    (MUTANTS[m].configs[0], (m,))
    for m in sorted(MUTANTS)
    if MUTANTS[m].configs[0] in ENC and m not in UNENCODED_MUTANTS
]


def _relation(enc: Encoding, rules: Rules, x: FCtx, s: Any) -> tuple[Any, dict[str, Any], Any]:
    cases = [(g, enc._changes(x, s, 0, go)) for g, go, _ in rules.cases()]
    post = {}
    for key, pre in s.v.items():
        v = pre
        for g, ch in cases:
            if key in ch:
                v = ITE(g, ch[key], v)
        post[key] = v
    refs: dict[str, Any] = {}
    earlier: list[Any] = []
    for b in rules.branches:
        if b.cond is False:
            continue
        if b.label.startswith("refuse"):
            g = b.cond if rules.disjoint else A(b.cond, *(N(e) for e in earlier))
            refs[b.label] = O(refs.get(b.label, False), g)
        earlier.append(b.cond)
        if b.cond is True:
            break
    return O(*(g for g, _ in cases)), refs, post


def _differ(enc: Encoding, name: str, hand: Any, a: Msg | None, glob: bool) -> z3.CheckSatResult:
    s = enc.state("eq")
    x = FCtx(enc, s)
    view = enc.view(s, 0)
    hr = hand(x) if glob else hand(x, view, a)
    tr = T.trace(name, x, None if glob else view, a)
    eh, rh, ph = _relation(enc, hr, x, s)
    et, rt, pt = _relation(enc, tr, x, s)
    same = [eh == et, *(rh.get(p, False) == rt.get(p, False) for p in set(rh) | set(rt))]
    same.append(z3.Implies(eh, z3.And(*(ph[k] == pt[k] for k in ph))))
    sol = z3.Solver()
    sol.add(_type_ok(x, view))
    sol.add(z3.Not(z3.And(*(z3.BoolVal(g) if isinstance(g, bool) else g for g in same))))
    return sol.check()


def _check(enc: Encoding, name: str, hand: Any) -> list[str]:
    a = ACTIONS[name]
    if a.arg != "msg":
        return [] if _differ(enc, name, hand, None, a.arg == "global") == z3.unsat else [name]
    bad = []
    for code in enc.codes:
        if msg_kind(code) in a.msgs:
            m = Msg(msg_kind(code), msg_epoch(code), msg_idx(code))
            if _differ(enc, name, hand, m, False) != z3.unsat:
                bad.append(f"{name}({code:#x})")
    return bad


@pytest.mark.nightly
@pytest.mark.parametrize(("config", "mutants"), WORLDS)
def test_traced_equals_hand_mirror(config: str, mutants: tuple[str, ...]) -> None:
    enc = Encoding(CONFIGS[config], frozenset(mutants))
    bad = [b for name, fn in sorted(HAND.items()) for b in _check(enc, name, fn)]
    assert not bad, bad


def test_traced_equals_hand_mirror_quick() -> None:
    enc = Encoding(CONFIGS["handoff_tp2to1"])
    bad = [b for name, fn in sorted(HAND.items()) for b in _check(enc, name, fn)]
    assert not bad, bad


def test_the_proof_has_teeth() -> None:
    """A wrong pairing, or the correct mirror against a mutant's trace, is found."""
    enc = Encoding(CONFIGS["handoff_tp2to1"])
    assert _differ(enc, "PrefillFinish", HAND["PrefillRun"], None, False) == z3.sat
    mut = Encoding(CONFIGS["handoff_tp2to1"], frozenset({"release_before_install"}))
    hand = HAND["PrefillSendChunk"]
    wrong = _differ(mut, "PrefillSendChunk", lambda x, v, a: hand(_correct(x), v, a), None, False)
    assert wrong == z3.sat


def _correct(x: FCtx) -> FCtx:
    y = FCtx(x.enc, x.s)  # type: ignore[arg-type]
    y.m = frozenset()
    return y
