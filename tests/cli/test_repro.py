"""``kvown repro``: every reproduction script behaves as documented, covers what the
README table says (every mutant, every incident, every seed failure), misuse exits 2,
and a reproduction whose bug does not show is reported as failed."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import pytest
import torch

from kvown_cli import repro as cmd_repro
from kvown_cli.main import main
from spec.mutants import MUTANTS


def kvown(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["repro", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@cache
def listing() -> list[dict[str, Any]]:
    return [cmd_repro.describe(n) for n in cmd_repro.script_names()]


@pytest.mark.parametrize("name", cmd_repro.script_names())
def test_every_repro_behaves_as_documented(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """One script per test, in this process: a mutant's script takes its counterexample
    from ``check_mutant``'s per-process cache, shared with the mutant's other tests (its
    name is the mutant's, so tests/conftest.py puts it in that mutant's xdist group);
    ``--all`` model-checked every mutant again in forked workers (61 s of the suite)."""
    rc, out, _ = kvown(capsys, name, "--json")
    (r,) = json.loads(out)["repros"]
    assert r["name"] == name
    assert r["ok"], (name, r["damage"], r["prevented"])
    assert rc == 0
    assert set(r) - {"skipped"} == {"name", "property", "damage", "prevented", "ok"}
    assert r["damage"] and r["prevented"] and r["property"]
    if name == "reload_on_critical_stream" and not torch.cuda.is_available():
        assert r["damage"] == "n/a on CPU" and r["skipped"] == "n/a on CPU"  # a skip, not an ok
    else:
        assert "skipped" not in r


def test_all_runs_every_script_in_order_and_fails_on_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--all``'s plumbing (each script behaves as documented above): it prefetches the
    mutants' model checks, runs every script in order, and exits 1 when one is not ok."""
    import refimpl.replay

    fetched: list[list[str]] = []
    monkeypatch.setattr(refimpl.replay, "prefetch", lambda todo: fetched.append(list(todo)))
    ran: list[str] = []

    def fake(name: str, narrate: bool) -> dict[str, object]:
        ran.append(name)
        ok = name != "sweep_only_on_admit"
        return {"name": name, "property": "P", "damage": "d", "prevented": "p", "ok": ok}

    monkeypatch.setattr(cmd_repro, "run_one", fake)
    rc, out, _ = kvown(capsys, "--all", "--json")
    rows = json.loads(out)["repros"]
    assert ran == [r["name"] for r in rows] == cmd_repro.script_names()
    assert fetched == [[r["mutant"] for r in listing() if r["mutant"]]]
    assert rc == 1
    monkeypatch.setattr(cmd_repro, "run_one", lambda n, narrate: {**fake(n, narrate), "ok": True})
    rc, _, _ = kvown(capsys, "--all", "--json")
    assert rc == 0


def test_the_scripts_cover_every_mutant_incident_and_seed_failure() -> None:
    rows = listing()
    assert {r["mutant"] for r in rows} - {None} == set(MUTANTS)
    covers = " ".join(c for r in rows for c in r["covers"])
    assert sorted(set(map(int, re.findall(r"incident (\d)", covers)))) == list(range(1, 8))
    assert sorted(set(map(int, re.findall(r"seed (\d)", covers)))) == list(range(1, 7))
    for r in rows:  # a mutant's script names the property the mutant breaks
        if r["mutant"] is not None:
            assert r["property"] == MUTANTS[r["mutant"]].expected, r["name"]


def test_the_readme_table_has_a_row_per_script() -> None:
    text = (cmd_repro.REPRO_DIR / "README.md").read_text()
    for r in listing():
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{r['name']}`")), "")
        assert row and f"`{r['property']}`" in row, r["name"]


def test_list_names_every_script_with_its_property(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = kvown(capsys, "--list")
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) == len(listing())
    for r, line in zip(listing(), lines, strict=True):
        assert line.split()[:2] == [r["name"], r["property"].split()[0]]
    rc, out, _ = kvown(capsys, "--list", "--json")
    assert rc == 0 and json.loads(out)["repros"] == listing()


def test_one_script_narrates_the_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = kvown(capsys, "sweep_only_on_admit")
    assert rc == 0
    assert "minimal counterexample, 6 steps" in out and "EnvCrash(prefill)" in out
    assert out.rstrip().endswith("verdict:   behaves as documented")


@pytest.mark.parametrize(
    "argv", [["nope"], ["--all", "nope"], [], ["--all", "sweep_only_on_admit"], ["--bogus"]]
)
def test_misuse_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, err = kvown(capsys, *argv)
    assert rc == 2 and out == ""
    if "nope" in argv:
        assert err.count("\n") == 1 and "sweep_only_on_admit" in err and "'nope'" in err


def test_a_bug_that_does_not_show_is_reported(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import refimpl.replay.repro as common
    from refimpl.engine import Engine

    monkeypatch.setattr(common, "Engine", lambda c, mutants=frozenset(), **kw: Engine(c, **kw))
    rc, out, _ = kvown(capsys, "release_before_install", "--json")  # the switch is ignored
    (row,) = json.loads(out)["repros"]
    assert rc == 1 and row["ok"] is False


def test_a_crashing_script_is_reported(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = cmd_repro.load("sweep_only_on_admit")
    monkeypatch.setattr(mod, "MUTANT", "no_such_mutant")
    rc, out, _ = kvown(capsys, "sweep_only_on_admit", "--json")
    (row,) = json.loads(out)["repros"]
    assert rc == 1 and row["ok"] is False and row["damage"] == ""
