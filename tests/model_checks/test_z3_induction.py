"""Inductive invariants for any number of requests, blocks and capacity (z3)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import z3

from kvown_cli import prove as cmd_prove
from model_checks.symbolic.core import Msg
from model_checks.symbolic.induction import Prover, conjuncts, shared_prover
from model_checks.symbolic.invariants import STRENGTHENING, SUPPORT
from spec.properties import SAFETY

IDS = [p.id for p in SAFETY]

# One prover per TP in the process (shared_prover: its terms are most of a proof's cost),
# shared with the CLI's proofs (claims.induction_claims), and the file on one worker so
# each is built once in the suite.
pytestmark = pytest.mark.xdist_group("tests/model_checks/test_z3_induction.py")


@pytest.fixture
def prover() -> Prover:
    return shared_prover(2)


@pytest.mark.parametrize("pid", IDS)
def test_property_is_proved(prover: Prover, pid: str) -> None:
    proof = prover.proof(pid)
    bad = [(s.action, s.result) for s in proof.steps if s.result != "proved"]
    assert proof.result == "proved", bad
    assert proof.conjuncts[0] == pid  # init + every transition
    assert len(proof.steps) == 1 + len(list(prover.m.actions()))


@pytest.mark.parametrize("tp", [1, 3, 4])
def test_whole_invariant_other_tp(tp: int) -> None:
    proof = shared_prover(tp).proof("all", [*IDS, *STRENGTHENING])
    assert proof.result == "proved"


def test_every_strengthening_conjunct_is_documented_and_used() -> None:
    used = {n for sup in SUPPORT.values() for n in sup}
    assert set(STRENGTHENING) <= used
    assert set(SUPPORT) == set(IDS)
    doc = (Path(__file__).resolve().parents[2] / "spec" / "INVARIANTS.md").read_text()
    for name in STRENGTHENING:
        assert f"`{name}`" in doc, name


def test_weakened_invariant_yields_a_cti(prover: Prover) -> None:
    names = [n for n in ("SingleWriter", *SUPPORT["SingleWriter"]) if n != "NackGaveUp"]
    proof = prover.proof("SingleWriter", names)
    assert proof.result == "unknown"
    bad = [s for s in proof.steps if s.result == "cti"]
    assert [s.action for s in bad] == ["PrefillResume(Nack)"]
    cti = proof.cti
    assert cti is not None and cti.action.startswith("PrefillResume(Nack(")
    text = cti.render()
    assert "before:" in text and "after:" in text and "p=writable" in text
    assert cti.failed  # names the conjunct the successor breaks


# Multi-turn append is in the induction (TurnIdle, TurnQuiet): on each turns mutant's spec
# the proof of the property it breaks fails at exactly the mutant's action (about 6 CPU s
# each: one in the suite, the others nightly).
TURN_MUTANTS = {
    "two_writers_on_session": ("SingleWriter", "TurnRoute"),
    "append_divergent_uncut": ("ContentIdentity", "DecodeAppend"),
    "append_after_evict": ("NothingLost", "TurnRoute"),
    "evict_pinned_session": ("NothingLost", "SessionEvict"),
}


@pytest.mark.parametrize(
    "mutant",
    [
        m if m == "two_writers_on_session" else pytest.param(m, marks=pytest.mark.nightly)
        for m in TURN_MUTANTS
    ],
)
def test_a_turns_mutant_breaks_its_induction(mutant: str) -> None:
    pid, action = TURN_MUTANTS[mutant]
    proof = Prover(2, mutants=frozenset({mutant})).proof(pid)
    assert proof.result == "unknown"
    assert [s.action for s in proof.steps if s.result == "cti"] == [action]


def test_property_alone_is_not_inductive(prover: Prover) -> None:
    """Why the strengthening exists: SingleWriter alone has counterexamples."""
    assert prover.proof("SingleWriter", ["SingleWriter"]).result == "unknown"


def test_not_vacuous(prover: Prover) -> None:
    """Init is satisfiable, and under the whole invariant every transition can fire
    (except duplicating a chunk, which the spec never does, and the staging steps, which
    the worlds without staging never take)."""
    m, cs = prover.m, conjuncts([*IDS, *STRENGTHENING])
    s = z3.Solver()
    s.add(*(f for _, f in m.param_facts), m.init(prover.s0, prover.probes))
    assert s.check() == z3.sat
    for act in m.actions():
        s = z3.Solver()
        s.add(*(f for _, f in prover.base))
        for c in cs:
            s.add(*(h for _, h in prover._hyp(c) if not isinstance(h, bool)))
        msg = Msg(act.kind, prover.em, prover.im) if act.kind is not None else None
        tr = m.trans(act, prover.s, prover.t, prover.r0, msg, prover.probes)
        s.add(tr)
        # the unbounded model's worlds have no staging: these never fire there
        staging = act.name in ("PrefillStage", "DecodeRecyclePrefix") or "Unstaged)" in act.label
        want = z3.unsat if act.label.startswith("EnvDuplicate(Chunk") or staging else z3.sat
        got = s.check()
        for seed in (1, 2, 3):  # quantifiers: z3 may give up ("unknown") on one search order
            if got != z3.unknown:
                break
            s.set("random_seed", seed)
            got = s.check()
        assert got == want, (act.label, s.reason_unknown() if got == z3.unknown else "")


def test_cli_property(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    cmd_prove.add_arguments(p)
    assert cmd_prove.run(p.parse_args(["--property", "Fencing"])) == 0
    assert "proved" in capsys.readouterr().out
    args = p.parse_args(["--property", "SingleWriter", "--drop", "NackGaveUp"])
    assert cmd_prove.run(args) == 1
    out = capsys.readouterr().out
    assert "counterexample to induction" in out and "PrefillResume" in out
    assert cmd_prove.run(p.parse_args(["--property", "Nope"])) == 2
