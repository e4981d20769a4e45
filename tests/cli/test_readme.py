"""The README's commands are the ones CI runs, and its tables name real things."""

from __future__ import annotations

from pathlib import Path

from spec.mutants import MUTANTS
from spec.properties import PROPERTIES

ROOT = Path(__file__).resolve().parents[2]


def _ci_command() -> str:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    marker = next(k for k, x in enumerate(lines) if "--- the README's test command" in x)
    return lines[marker + 1].strip()


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert _ci_command() in readme


def test_readme_property_table_lists_every_property() -> None:
    readme = (ROOT / "README.md").read_text()
    for pid in PROPERTIES:
        assert f"| {pid} |" in readme, pid


def test_spec_md_names_every_property_and_mutant() -> None:
    spec_md = (ROOT / "spec" / "SPEC.md").read_text()
    for pid in PROPERTIES:
        assert f"`{pid}`" in spec_md, pid
    for name in MUTANTS:
        assert f"`{name}`" in spec_md, name


def test_ci_builds_its_own_venv_in_a_temporary_folder() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert "mktemp -d" in script and "-m venv" in script and "--system-site-packages" not in script
    lines = script.splitlines()
    venv = next(k for k, x in enumerate(lines) if "-m venv" in x)
    test = next(k for k, x in enumerate(lines) if "--- the README's test command" in x)
    assert venv < test  # the README's command runs inside it


def test_the_ci_example_script_and_workflow_run_the_same_kvown_steps() -> None:
    shell = (ROOT / "examples" / "ci" / "kvown-ci.sh").read_text()
    workflow = (ROOT / "examples" / "ci" / "github-workflow.yml").read_text()
    for step in (
        'kvown check --junit "$OUT_DIR/junit/check.xml" --cex-dir "$OUT_DIR/artifacts"',
        'kvown check-trace "$log" --json --junit "$OUT_DIR/junit/trace-$name.xml"',
        'kvown fuzz --profile ci --json --junit "$OUT_DIR/junit/fuzz.xml" "${cap[@]}"',
        "cap=(--examples 100 --seconds",
    ):
        assert step in shell and step in workflow, step
