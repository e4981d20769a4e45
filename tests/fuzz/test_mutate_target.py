"""``kvown mutate --target refimpl``: what it mutates, what it leaves out, the reviewed
equivalents, the CLI's checks of its options, and one mutant judged end to end."""

from __future__ import annotations

import json
import sys
from functools import cache

import pytest

from kvown_cli.main import main
from model_checks.mutation import run_mutants
from model_checks.mutation.operators import Mutant
from model_checks.mutation.target import Target
from refimpl.testing.mutate import EXCLUDE, engine_files, target

# The tests that read the target's mutants run on one xdist worker and generate them once.
MUTANTS = pytest.mark.xdist_group("tests/fuzz/test_mutate_target.py::mutants")


@cache
def _mutants() -> tuple[Mutant, ...]:
    """``target().mutants()``, generated once per process (tens of CPU s): the mutants do
    not depend on the target's checks or example count."""
    return tuple(target(unit=False).mutants())


def test_the_target_mutates_the_code_the_fuzzer_drives() -> None:
    files = engine_files()
    assert "refimpl/engine/decode.py" in files and "refimpl/blocks.py" in files
    assert "refimpl/reshard.py" in files  # driven by the block-table fuzz
    assert not any(f.startswith(("refimpl/testing/", "refimpl/demo/")) for f in files)


@MUTANTS
def test_self_checks_and_switch_only_code_are_left_out() -> None:
    ms = _mutants()
    assert len(ms) > 1000
    assert not any(m.id.startswith(EXCLUDE) for m in ms)
    # after `if "source_writes_while_frozen" not in self.m: raise ...`: the switch's code
    assert not any("G_FROZEN_WRITE" in m.description for m in ms)
    assert any("source_writes_while_frozen" in m.description for m in ms)  # the test itself


@MUTANTS
def test_every_reviewed_equivalent_is_a_mutant_with_a_reason() -> None:
    t = target(unit=False)
    eq = t.load_equivalents()
    ids = {m.id for m in _mutants()}
    assert sorted(set(eq) - ids) == []  # a stale entry: the source moved on, review again
    assert all(len(reason) > 20 for reason in eq.values())


@pytest.mark.parametrize(
    "argv",
    [
        ["--sample", "0"],
        ["--jobs", "0"],
        ["--jobs", "1000"],
        ["--timeout", "nan"],
        ["--target", "nope"],
        ["--min-kill", "2"],
    ],
)
def test_bad_options_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutate", *argv]) == 2
    assert capsys.readouterr().err.startswith("error: kvown mutate:")


@MUTANTS
def test_list_names_the_sampled_mutants(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's sample and listing; the target's generation (11 CPU s again here) is the
    group's ``_mutants()``, which the tests above check."""
    ms = _mutants()
    monkeypatch.setattr(Target, "mutants", lambda self: list(ms))
    assert main(["mutate", "--list", "--sample", "3", "--no-unit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(":" in ln.split()[0] for ln in lines)
    assert {ln.split()[0] for ln in lines} <= {m.id for m in ms}


@MUTANTS
def test_a_leak_mutant_is_killed_by_the_tour_check_in_its_own_process() -> None:
    t = target(unit=False, examples=5)
    assert t.files == target(unit=False).files  # the same mutants as _mutants()
    [m] = [  # the free of the finished request's blocks dropped: they leak
        m
        for m in _mutants()
        if m.id.startswith("refimpl.engine.prefill.PrefillActions.PrefillFinish:drop_call")
        and "-        self.P.alloc.free(self.rid(i))" in m.to_json().get("diff", "")
    ]
    [res] = run_mutants(t.root, [m], t.checks, copy=t.copy, stop_at_first_kill=True)
    assert res.outcomes == {"tour": "killed"}, res.details  # the tour first; fuzz not run
    assert res.details["tour"].startswith("killed on ")
    assert json.dumps(m.to_json())  # the report's shape
    assert [c.name for c in t.checks] == ["tour", "fuzz"]
    assert sys.executable in t.checks[0].argv
