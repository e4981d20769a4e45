"""INVARIANTS.md's conjuncts, evaluated by ``kvown check`` on every state: one vocabulary
with the z3 proof, a broken conjunct reported by its name with a counterexample, and the
mutant that only a conjunct catches (``release_keeps_wait``, ``Frozen``).

One meaning too: the z3 conjuncts of ``model_checks/symbolic/invariants.py`` (the
predicates of ``spec/invariants`` traced and split by scope), read on concrete states
(Python ints stand for terms; the connectives fold them), agree with the predicates on
states reached by the correct spec and by mutants, and on seeded one-field
perturbations of them (most break some conjunct, so both verdicts are exercised): the
split by scope loses nothing."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvown_cli.main import main
from model_checks.explicit.explore import explore
from model_checks.explicit.runner import check_mutant
from model_checks.symbolic.core import RV, Ctx, NetView, Params
from model_checks.symbolic.invariants import STRENGTHENING, Conj
from spec.config import Config, get_config
from spec.invariants import INVARIANTS, broken_invariants, for_config
from spec.properties import PROPERTIES, violated_safety
from spec.state import (
    AWAIT_ACK,
    COMPLETE,
    FILLING,
    M_ACK,
    M_CHUNK,
    M_NACK,
    RESERVED,
    WRITABLE,
    Req,
    World,
    msg,
    msg_kind,
)

ROOT = Path(__file__).resolve().parents[2]
SCOPE = {"req": "request", "slot": "slot", "glob": "global"}


def test_one_vocabulary_with_the_z3_proof_and_the_doc() -> None:
    assert tuple(INVARIANTS) == tuple(STRENGTHENING)
    assert {n: SCOPE[j.scope] for n, j in STRENGTHENING.items()} == {
        n: j.scope for n, j in INVARIANTS.items()
    }
    doc = (ROOT / "spec" / "INVARIANTS.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (?:request|slot|global) \|", doc, re.M)
    assert sorted(rows) == sorted(INVARIANTS)
    assert not set(INVARIANTS) & set(PROPERTIES)  # a conjunct's name is not a property's


def test_claimed_where_the_proof_covers_the_world() -> None:
    assert [n for n, _ in for_config(get_config("restart_handoff"))] == []
    staged = {n for n, _ in for_config(get_config("identity_prefix"))}
    assert staged == set(INVARIANTS) - {"PrefixOwn", "StagedOnly", "NoUnstaged"}
    assert {n for n, _ in for_config(get_config("handoff_crash"))} == set(INVARIANTS)


@cache
def _states(name: str) -> tuple[Config, tuple[World, ...]]:
    c = get_config(name)
    return c, tuple(explore(c).states)


def _edit(name: str, pick: Callable[[Req], bool], edit: Callable[[Req], Req]) -> World:
    """A reachable state of ``name`` whose request 0 satisfies ``pick``, edited."""
    c, states = _states(name)
    w = next(w for w in states if pick(w.reqs[0]))
    assert broken_invariants(w, c) == []
    return w._replace(reqs=(edit(w.reqs[0]), *w.reqs[1:]))


def _add(r: Req, code: int) -> Req:
    return r._replace(net=tuple(sorted((*r.net, code))))


HAND_MADE: dict[str, tuple[Callable[[Req], bool], Callable[[Req], Req]]] = {
    # the source freed while the sender still waits for the Ack: no property sees it
    "Frozen": (
        lambda r: r.ps == AWAIT_ACK and r.d == WRITABLE,
        lambda r: r._replace(p=0),
    ),
    "AckCommitted": (lambda r: r.d == RESERVED, lambda r: _add(r, msg(M_ACK, r.ep))),
    "NackGaveUp": (lambda r: r.d == FILLING, lambda r: _add(r, msg(M_NACK, r.dep))),
    "DecodeCurrent": (
        lambda r: r.d == COMPLETE and r.ep == 1,
        lambda r: r._replace(ep=2),
    ),
    "ChunkOnce": (
        lambda r: any(msg_kind(x) == M_CHUNK for x in r.net),
        lambda r: _add(r, next(x for x in r.net if msg_kind(x) == M_CHUNK)),
    ),
}


@pytest.mark.parametrize("name", sorted(HAND_MADE))
def test_a_hand_made_state_breaks_the_conjunct_by_name(name: str) -> None:
    w = _edit("handoff_crash", *HAND_MADE[name])
    c = get_config("handoff_crash")
    assert name in broken_invariants(w, c)
    if name == "Frozen":
        assert violated_safety(w, c) == []  # why the conjunct is needed in the check


def test_release_keeping_the_wait_state_is_caught_by_frozen_alone() -> None:
    r = check_mutant("release_keeps_wait")
    assert r.caught and r.expected == "Frozen" and r.trace is not None
    assert not set(r.violated) & set(PROPERTIES)  # no property sees it: only the conjunct
    last = r.trace.steps[-1]
    assert last["action"] == "PrefillRelease"


def test_every_conjunct_holds_on_the_correct_spec_of_the_same_config() -> None:
    c, states = _states("handoff_crash")
    assert len(states) > 3000 and all(broken_invariants(w, c) == [] for w in states)


def test_cli_names_the_broken_conjunct(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "--mutant", "release_keeps_wait", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["violated"] == "Frozen" and out["trace_length"] == len(out["trace"])
    rc = main(["check", "--config", "offload_contend", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and [j["id"] for j in out["invariants"]] == list(INVARIANTS)
    assert all(j["holds"] for j in out["invariants"])


# -- one meaning: the z3 formulas on concrete states ------------------------------------
class _Net(NetView):
    def __init__(self, r: Req) -> None:
        self.r = r

    def count(self, kind: int, e: Any, i: Any) -> Any:
        return self.r.net.count(msg(kind, e, i))


class _Landed:
    def __init__(self, mask: int) -> None:
        self.mask = mask

    def __getitem__(self, i: int) -> bool:
        return bool(self.mask >> i & 1)


class _Ctx(Ctx):
    def __init__(self, w: World, c: Config) -> None:
        self.c, self.m = Params.of(c), frozenset()
        self.faults, self.p_up, self.d_up = w.faults, w.p_up, w.d_up
        self.pfx, self.pfx_ref, self.pfx_ok = w.pfx, w.pfx_ref, w.pfx_ok


def _view(r: Req) -> RV:
    vals = {f: getattr(r, f) for f in RV.__dataclass_fields__ if f not in ("net", "landed")}
    return RV(**vals, landed=_Landed(r.landed), net=_Net(r))


def _slots(c: Config, r: Req) -> set[tuple[int, int]]:
    """The slots a slot conjunct can fail at: each message's, each landed chunk's."""
    out = {((code >> 8) & 0xFFFF, code & 0xF) for code in r.net}
    return out | {(r.ep, i) for i in range(r.landed.bit_length()) if r.landed >> i & 1}


def z3_holds(j: Conj, w: World, c: Config, every_slot: bool = False) -> bool:
    x = _Ctx(w, c)
    out: list[Any] = []
    if j.glob is not None:
        out.append(j.glob(x))
    for r in w.reqs:
        v = _view(r)
        if j.req is not None:
            out.append(j.req(x, v))
        if j.slot is not None:
            width = max(c.src_tp * c.blocks, c.src_tp, c.prefix + 1)
            grid = _slots(c, r)
            if every_slot:  # and every empty slot too: each conjunct holds there
                grid |= {(e, i) for e in range(c.max_attempts + 2) for i in range(width)}
            out += [j.slot(x, v, e, i) for e, i in sorted(grid)]
    assert all(isinstance(b, bool) for b in out), f"{j.name}: a term, not a verdict"
    return all(out)


def _perturb(w: World, rng: random.Random) -> World:
    """One field of one request (or a global) set to another small value."""
    k = rng.randrange(len(w.reqs))
    r = w.reqs[k]
    f = rng.choice(("st", "p", "d", "h", "ps", "ep", "dep", "sent", "phit", "hit", "landed",
                    "dfl", "mv", "pstep", "dstep", "net", "net"))  # fmt: skip
    if f == "net":
        e = rng.randrange(0, r.ep + 2)
        code = msg(rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 9, 13)), e, rng.randrange(3))
        r = r._replace(net=tuple(sorted((*r.net, code))))
    elif f == "dfl":
        r = r._replace(dfl=r.dfl ^ rng.choice((4, 8, 16)))
    else:
        r = r._replace(**{f: rng.randrange(0, 7 if f in ("st", "landed") else 4)})
    reqs = w.reqs[:k] + (r,) + w.reqs[k + 1 :]
    if rng.random() < 0.1:
        return w._replace(reqs=reqs, pfx_ok=not w.pfx_ok)
    return w._replace(reqs=reqs)


CASES = [  # (config, mutant): small worlds, each reaching some conjunct's edge
    ("handoff_crash", None),
    ("offload_contend", None),
    ("async_handoff", None),
    ("handoff_retract", "retract_keeps_epoch"),
    ("handoff_crash", "release_keeps_wait"),
    ("handoff_unrevocable", "batch_status_subset"),
]


@pytest.mark.parametrize(("config", "mutant"), CASES)
def test_z3_conjuncts_and_spec_predicates_agree(config: str, mutant: str | None) -> None:
    c = get_config(config)
    m = frozenset({mutant} if mutant else ())
    g = explore(c, m, stop_on=None if mutant is None else "*", max_states=20_000)
    rng = random.Random(f"agree:{config}:{mutant}")
    worlds = g.states[:: max(1, len(g.states) // 120)]
    worlds += [_perturb(w, rng) for w in worlds for _ in range(2)]
    falses = {n: 0 for n in INVARIANTS}
    for k, w in enumerate(worlds):
        for name, j in INVARIANTS.items():
            want = z3_holds(STRENGTHENING[name], w, c, every_slot=k % 40 == 0)
            got = j.pred(w, c)
            assert got == want, f"{name} on {config}: spec {got}, z3 {want} at {w}"
            falses[name] += not got
    assert sum(1 for n in falses if falses[n]) >= 8, falses  # both verdicts exercised
