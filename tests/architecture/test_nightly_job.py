"""The long set runs: ``.ci/nightly`` makes its venv as ``.ci/run`` does, runs every step it
names, and its record in benchmarks/RESULTS.md is kept fresh.

Fresh means: the record's commit is an ancestor of HEAD, and at most ``MAX_BEHIND``
first-parent commits of HEAD that touch ``spec/`` or ``refimpl/`` lie after it
(``git rev-list --first-parent --count REC..HEAD -- spec refimpl``). That is "one issue's
work": the integrator's rounds of this repository's history, merges and fixes on main,
were 11, 2, 18 and 13 such commits (the rounds of 2026-11-30 and 2026-12-01), so 20 lets
the nightly run once per issue, before its last merges, and fails in the round after an
issue that did not run it. Counted on first parents, a merged branch is one commit, its
own commits are not counted. Skipped outside a git checkout with history (an sdist, a
shallow clone), where the ancestry cannot be read."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
MAX_BEHIND = 20


def _record_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "nightly_record", ROOT / ".ci" / "nightly_record.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


REC = _record_module()


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _preamble(script: str, start: str, end: str) -> list[str]:
    lines = (ROOT / ".ci" / script).read_text().splitlines()
    first = next(k for k, x in enumerate(lines) if x.startswith(start))
    last = next(k for k, x in enumerate(lines) if end in x)
    return lines[first:last]


def test_the_nightly_makes_its_venv_as_ci_run_does() -> None:
    run = _preamble("run", "PYTHON=", "--- the README's test command")
    nightly = _preamble("nightly", "PYTHON=", "--- the end of the shared preamble")
    assert run == nightly and any("-m venv" in x for x in run)


def test_the_nightly_runs_every_step_it_is_for() -> None:
    script = (ROOT / ".ci" / "nightly").read_text()
    for step in (
        "step pytest env KVOWN_NIGHTLY=1 KVOWN_NIGHTLY_JOB=1 python -m pytest",
        "step deep kvown check --suite deep",
        'step tour python "$REPO/.ci/nightly_tour.py"',
        "step mutate-spec kvown mutate --target spec --sample",
        "step mutate-refimpl kvown mutate --target refimpl --sample",
    ):
        assert step in script, step
    assert 'pip install -q torch==2.13.0 -e ".[dev]"' in script


def test_the_record_reads_back_and_a_malformed_one_is_refused(tmp_path: Path) -> None:
    rec = REC.parse(RESULTS.read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", rec.commit) and rec.result in ("pass", "FAIL", "partial")
    assert rec.summary.startswith("nightly: ")
    copy = tmp_path / "RESULTS.md"
    copy.write_text(RESULTS.read_text())
    new = REC.write(copy, "a" * 40, "pass", "nightly: pass in 1s: deep ok 1s")
    assert REC.parse(copy.read_text()) == new and new.commit == "a" * 40
    for bad in ("no record here", RESULTS.read_text() * 2):
        with pytest.raises(ValueError, match="expected one"):
            REC.parse(bad)


def test_the_kill_summary_reads_both_targets_reports(tmp_path: Path) -> None:
    """The spec report counts ``not_covered``, the refimpl report lists them: the first
    nightly run ended (set -e) on a summary that took the count for a list."""
    spec = {"mutants": 30, "killed": 18, "not_covered": 0, "survivors": [], "kill_rate": 0.6}
    refimpl = {"mutants": 12, "killed": 9, "not_covered": [{"id": "x"}], "kill_rate": 0.75}
    for report, want in (
        (spec, "killed 18 of 30 (kill rate 0.6)"),
        (refimpl, "killed 9 of 12 (kill rate 0.75)"),
    ):
        out = tmp_path / "mutate.out"
        out.write_text("kvown mutate: plan ...\n" + json.dumps(report, indent=2))
        assert REC.rate(out) == want
    out.write_text("Traceback (most recent call last): ...")
    assert REC.rate(out) == "(no report)"


def test_the_record_is_at_most_one_issue_older_than_spec_and_refimpl() -> None:
    if os.environ.get("KVOWN_NIGHTLY_JOB") == "1":
        pytest.skip("inside .ci/nightly: the job that writes the record (it would judge itself)")
    if _git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the record's ancestry is not here")
    rec = REC.parse(RESULTS.read_text())
    assert _git("cat-file", "-e", f"{rec.commit}^{{commit}}").returncode == 0, (
        f"the nightly record's commit {rec.commit} is not in this repository"
    )
    assert _git("merge-base", "--is-ancestor", rec.commit, "HEAD").returncode == 0, (
        f"the nightly record's commit {rec.commit} is not an ancestor of HEAD"
    )
    behind = _git(
        "rev-list", "--first-parent", "--count", f"{rec.commit}..HEAD", "--", "spec", "refimpl"
    )
    n = int(behind.stdout.strip())
    assert n <= MAX_BEHIND, (
        f"{n} commits touched spec/ or refimpl/ since the nightly record ({rec.date}, "
        f"{rec.commit[:10]}): run .ci/nightly --record and commit benchmarks/RESULTS.md"
    )


def _tour_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nightly_tour", ROOT / ".ci" / "nightly_tour.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_tour_step_slices_only_a_tour_over_its_budget_and_covers_it_in_turn() -> None:
    """``.ci/nightly_tour.py``: a tour within the budget runs whole; a larger one runs every
    k-th sequence, and k nights in a row run each sequence exactly once."""
    slice_of = _tour_module().slice_of
    assert slice_of(562, 7_864, 40_000, None) == (0, 1)
    k = slice_of(8_036, 135_653, 40_000, 0)[1]
    assert k == 4
    seen = sorted(
        i
        for night in range(k)
        for i in range(8_036)[slice_of(8_036, 135_653, 40_000, night)[0] :: k]
    )
    assert seen == list(range(8_036))
    assert slice_of(3, 10_000, 10, 7) == (1, 3)  # never more slices than sequences


def test_the_tour_step_tours_every_default_world_and_edge_tour_once() -> None:
    """offload_crash joined the default suite while the step still added ``EDGE_TOURS[2:]``
    (offload_crash): toured twice a night."""
    from refimpl.testing.tour import EDGE_TOURS
    from spec.config import DEFAULT_SUITE

    got = _tour_module().worlds()
    assert len(got) == len(set(got))
    assert set(got) == set(DEFAULT_SUITE) | set(EDGE_TOURS)
