"""The z3 safety properties are the spec's own predicates, traced (issue #32, "one
definition"): ``symbolic.props.ZPROPS`` holds no formula of its own, and its three scopes
(global, one request, one message in flight) together say exactly what
``spec.properties`` says.

The check: on states of several worlds (reachable ones from random walks, and the same
states with one field or one message changed at random, so that every property is both
held and broken somewhere), the finite encoding's ``holds(prop, s)`` evaluated at the
state equals the spec predicate's verdict, property by property."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import z3

from model_checks.symbolic.agree import random_states
from model_checks.symbolic.bmc import shared_encoding
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.props import ZPROPS
from spec.config import CONFIGS
from spec.properties import SAFETY
from spec.state import World

# worlds whose behaviours reach every scope (TP 2 ranks, the shared host cache and the
# messages' incarnations (restarts) in the suite; crashes, the decode-side prefix, async
# steps, turns, content identity, decode ranks, retraction and layers nightly)
WORLDS = (
    "handoff_tp2to1",
    "host_cache_store",
    "restart_handoff",
    pytest.param("stream_one", marks=pytest.mark.nightly),
    pytest.param("turns_two", marks=pytest.mark.nightly),
    pytest.param("identity_prefix", marks=pytest.mark.nightly),
    pytest.param("prefix_crash", marks=pytest.mark.nightly),
    pytest.param("async_handoff", marks=pytest.mark.nightly),
    pytest.param("handoff_tp1to2", marks=pytest.mark.nightly),
    pytest.param("handoff_retract", marks=pytest.mark.nightly),
)
FIELDS = {"st": 7, "p": 6, "d": 6, "h": 6, "ps": 4, "dfl": 32, "g": 64, "hit": 3, "dmask": 4}


def _perturbed(enc: Encoding, w: World, rng: random.Random) -> World:
    """``w`` with one field of one request, or one message, changed at random."""
    i = rng.randrange(len(w.reqs))
    r = w.reqs[i]
    if enc.codes and rng.random() < 0.4:
        r = r._replace(net=tuple(sorted((*r.net, rng.choice(enc.codes)))))
    else:
        f = rng.choice([f for f in FIELDS if f in enc.fields])
        r = r._replace(**{f: rng.randrange(FIELDS[f])})
    reqs = list(w.reqs)
    reqs[i] = r
    return w._replace(reqs=tuple(reqs))


def _value(enc: Encoding, term: object, s: object, w: World) -> bool:
    if isinstance(term, bool):
        return term
    assert isinstance(term, z3.ExprRef)
    pairs = [(v, z3.BoolVal(bool(x)) if z3.is_bool(v) else _num(v, x)) for v, x in _vals(enc, s, w)]
    out = z3.simplify(z3.substitute(term, *pairs))
    assert z3.is_true(out) or z3.is_false(out), f"not a value: {out}"
    return z3.is_true(out)


def _num(v: z3.ExprRef, x: int) -> z3.ExprRef:
    return z3.BitVecVal(x, v.size()) if z3.is_bv(v) else z3.IntVal(x)


def _vals(enc: Encoding, s: object, w: World) -> list[tuple[z3.ExprRef, int]]:
    return [(s[k], int(x)) for k, x in enc.values(w).items()]  # type: ignore[index]


@pytest.mark.by_encoding
@pytest.mark.parametrize("name", WORLDS)
def test_derived_properties_say_what_the_spec_says(name: str) -> None:
    c = CONFIGS[name]
    enc = shared_encoding(c)  # the config's one encoding (tests/conftest.py by_encoding)
    s = enc.state("s")
    terms = {p.id: enc.holds(p.id, s) for p in SAFETY}
    rng = random.Random(0)
    states = random_states(c, frozenset(), 30, rng)
    states += [_perturbed(enc, w, rng) for w in states for _ in range(3)]
    seen: Counter[tuple[str, bool]] = Counter()
    for w in states:
        try:
            enc.values(w)
        except ValueError:  # a value outside the encoding's variables
            continue
        for p in SAFETY:
            assert p.pred is not None
            want = p.pred(w, c)
            assert _value(enc, terms[p.id], s, w) == want, (name, p.id, w)
            seen[(p.id, want)] += 1
    broken = {pid for pid, ok in seen if not ok}
    assert len(broken) >= 4, f"{name}: too few properties broken in the sample: {broken}"


def test_no_formula_of_its_own() -> None:
    """Every z3 property is a spec predicate, the same object."""
    assert [(z.id, z.pred) for z in ZPROPS.values()] == [(p.id, p.pred) for p in SAFETY]
