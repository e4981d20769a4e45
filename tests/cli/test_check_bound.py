"""A state bound reached is a verdict, not an internal error (issue #35): ``kvown check``
ends with exit 4 and "bound reached, N states, properties held so far"; the bound is
``--max-states`` (tested small on a small config). And ``--all-mutants --cex-dir`` writes
every counterexample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvown_cli.check as check_cmd
from kvown_cli.main import main
from spec.mutants import MUTANTS


def test_the_bound_reached_is_exit_4_with_what_held(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "--config", "offload_contend", "--max-states", "50"])
    out = capsys.readouterr()
    assert rc == 4, out
    assert "state bound reached, 50 states explored" in out.out
    assert "every safety property held on them" in out.out
    assert "internal error" not in out.err


def test_the_bound_in_json_and_on_two_workers(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ([], ["--workers", "2"]):
        rc = main(["check", "--config", "offload_contend", "--max-states", "50", "--json", *extra])
        got = json.loads(capsys.readouterr().out)
        assert rc == 4
        assert got["bound_reached"]["config"] == "offload_contend"
        assert got["bound_reached"]["states"] == 50
    assert got["bound_reached"]["violated"] is None  # the parallel explorer does not say


def test_a_bound_above_the_config_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", "offload_contend", "--max-states", "734", "--json"]) == 0
    (cfg,) = json.loads(capsys.readouterr().out)["configs"]
    assert cfg["distinct_states"] == 734  # pinned


def test_the_help_names_exit_4(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-states N" in text and "exit 4" in text


def test_all_mutants_writes_every_counterexample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    two = dict(list(MUTANTS.items())[:2])
    monkeypatch.setattr(check_cmd, "MUTANTS", two)
    assert main(["check", "--all-mutants", "--cex-dir", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and all(f.endswith(".json") for f in files)
    assert {json.loads((tmp_path / f).read_text())["mutants"][0] for f in files} == set(two)
    for f in files:  # each replays to its violation
        assert main(["replay", str(tmp_path / f)]) == 1, f
    capsys.readouterr()
    # several files at once, as `kvown replay cex/*.json` gives them
    assert main(["replay", "--json", *(str(tmp_path / f) for f in files)]) == 1
    rows = json.loads(capsys.readouterr().out)["replays"]
    assert [r["file"] for r in rows] == [str(tmp_path / f) for f in files]
    assert all(r["reproduced"] for r in rows)
    assert main(["replay", *(str(tmp_path / f) for f in files)]) == 1
    assert capsys.readouterr().out.count("REPRODUCED: config") == 2


README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
VERDICT = (  # the README's words for `kvown check --config reject_retry` (the bound's verdict)
    "state bound reached, {n} states explored (every safety property held on them);"
    " no verdict on the states beyond"
)


def test_reject_retry_reaches_a_small_bound_with_the_readme_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's reject_retry row, on the same code path with a bound of 2,000 states
    (the default 2,000,000 takes 12.6 minutes at load 4 to 8: the nightly twin below)."""
    from model_checks.explicit.runner import MAX_STATES

    assert MAX_STATES == 2_000_000 and VERDICT.format(n=MAX_STATES) in README
    assert "`kvown check --config reject_retry` ends with the bound's verdict, exit 4" in README
    assert main(["check", "--config", "reject_retry", "--max-states", "2000"]) == 4
    out = capsys.readouterr()
    assert VERDICT.format(n=2000) in out.out and "internal error" not in out.err


@pytest.mark.nightly
def test_reject_retry_ends_with_the_bound_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", "reject_retry"]) == 4
    assert VERDICT.format(n=2_000_000) in capsys.readouterr().out
