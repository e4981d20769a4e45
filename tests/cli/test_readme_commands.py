"""The README's command table, run in a quick form (issue #26: every README claim checked).

Each row's command maps to a quick form here: the same command with a smaller workload
(one config, a few examples, two requests) or, where only its length differs, its
``--list``. A new row without a quick form fails the first test."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kvown_cli.main import main
from spec.config import SUITES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TABLE = README[README.index("| command | what it does |") : README.index("## As a library")]
ROWS = re.findall(r"^\| `(kvown [^`]*)` \|", TABLE, re.M)

CEX = "kvown check --mutant free_on_cancel_in_flight --cex-dir cex; kvown replay cex/*.json"
# README command -> (quick argv, expected exit code, words the output must hold)
QUICK: dict[str, tuple[list[str], int, tuple[str, ...]]] = {
    "kvown check --all-mutants": (["check", "--mutant", "failed_store_visible"], 1, ()),
    "kvown check --mutant free_on_cancel_in_flight": (
        ["check", "--mutant", "free_on_cancel_in_flight"],
        1,
        ("vllm #32255", "=> violates NoReuseUnderIO"),
    ),
    "kvown prove": (["prove", "--only", "layout", "--quick"], 0, ("claims",)),
    "kvown demo": (["demo", "--steps", "1"], 0, ()),
    "kvown repro --all": (["repro", "failed_store_visible"], 0, ("behaves as documented",)),
    "kvown check-trace repro/traces/incident1_vllm_32255.jsonl": (
        ["check-trace", str(ROOT / "repro/traces/incident1_vllm_32255.jsonl")],
        1,
        ("VIOLATION", "NoReuseUnderIO"),
    ),
    "kvown fuzz --all-mutants": (["fuzz", "--config", "offload_contend", "--examples", "2"], 0, ()),
    "kvown cluster --requests 200 --kill random": (
        ["cluster", "--requests", "2", "--no-raw", "--kill", "random", "--log-dir", "{tmp}"],
        0,
        ("merged log conforms",),
    ),
    "kvown check --suite deep": (["check", "--suite", "deep", "--help"], 0, ("deep",)),
    "kvown mutate --target spec --json": (
        ["mutate", "--target", "spec", "--list", "--sample", "3"],
        0,
        ("spec/actions_",),
    ),
    "kvown mutate --target refimpl --sample 30": (
        ["mutate", "--target", "refimpl", "--sample", "30", "--list"],
        0,
        ("refimpl/",),
    ),
    "kvown list": (["list"], 0, ("free_on_cancel_in_flight", "NoReuseUnderIO")),
    "kvown --version": (["--version"], 0, ("kvown 0.",)),
    "kvown fuzz --tour": (["fuzz", "--tour", "--config", "mismatch_one"], 0, ("graph tour",)),
    "kvown fuzz --tour --impl api": (  # every closed edge covered, no divergence: exit 0
        ["fuzz", "--tour", "--impl", "api", "--config", "mismatch_one"],
        0,
        ("graph tour on refimpl.api", "mismatch_one  edges    352  352/352 edges"),
    ),
    "kvown check --config handoff_tp2to1 --workers 2": (
        ["check", "--config", "handoff_crash", "--workers", "2"],
        0,
        ("handoff_crash",),
    ),
}


# rows whose quick form still takes minutes of CPU: run with KVOWN_NIGHTLY=1
NIGHTLY = {"kvown mutate --target refimpl --sample 30"}  # generating the mutants: 4 CPU s (was 19)


def test_every_row_of_the_command_table_has_a_quick_form() -> None:
    assert sorted(ROWS) == sorted([*QUICK, CEX])


@pytest.mark.parametrize("row", sorted(QUICK))
def test_the_quick_form_of_a_readme_command_does_what_it_says(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, row: str
) -> None:
    if row in NIGHTLY and os.environ.get("KVOWN_NIGHTLY") != "1":
        pytest.skip("nightly: KVOWN_NIGHTLY=1")
    argv, rc, words = QUICK[row]
    assert main([a.replace("{tmp}", str(tmp_path / "logs")) for a in argv]) == rc
    out = capsys.readouterr().out
    for w in words:
        assert w in out, (row, w)


def test_the_deep_suite_is_the_nineteen_worlds_the_readme_names() -> None:
    from spec.behaviours.worlds import COMPOSED

    assert "nineteen worlds: seven larger ones" in README and len(SUITES["deep"]) == 19
    assert "`stream_reuse`" in README and "stream_reuse" in SUITES["deep"]
    assert set(COMPOSED) <= set(SUITES["deep"]) and len(COMPOSED) == 11


def test_the_counterexample_row_saves_and_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--mutant", "free_on_cancel_in_flight", "--cex-dir", "cex"]) == 1
    (path,) = (tmp_path / "cex").glob("*.json")
    capsys.readouterr()
    assert main(["replay", str(path), "--json"]) == 1
    v = json.loads(capsys.readouterr().out)
    assert v["reproduced"] and v["violated"] == "NoReuseUnderIO"


def test_the_fuzz_rows_switch_count_is_the_engines() -> None:
    """The kill matrix's row names its switch count twice (the measured run, the bound
    N × S): both are the engine's switches (the row said 45 when there were 47)."""
    from refimpl.testing import EngineAdapter

    n = len(EngineAdapter().switches())
    row = next(ln for ln in TABLE.splitlines() if ln.startswith("| `kvown fuzz --all-mutants`"))
    assert f"{n} switches: " in row and f"within {n} × S" in row, n


def test_the_check_rows_bug_count_is_the_mutants() -> None:
    """``kvown check --all-mutants`` judges every mutant of spec/mutants.py (the row said 44
    when there were 46)."""
    from spec.mutants import MUTANTS

    assert f"| `kvown check --all-mutants` | the {len(MUTANTS)} known bugs of" in TABLE
