"""Progress in a CI log (issue #26): with stderr not a terminal, every long command writes
plain lines at a steady rate (``kvown CMD: DONE/TOTAL UNIT, ...``, no ``\\r``); Ctrl-C says
what was done; ``mutate`` prints its plan and estimate; piped tables keep full names;
``repro`` calls an n/a script skipped; JUnit times from ``check`` add up to the run.

The slow work is replaced by stand-ins that report progress as the real one does (the
commands' own wiring is what is tested); ``check`` runs for real on a small config."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvown_cli.main import main
from kvown_cli.progress import Progress

LINE = re.compile(r"^kvown (\w+): (\d+)(/(\d+))? [\w ]+, ")


@pytest.fixture(autouse=True)
def _fast_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVOWN_PROGRESS_SECONDS", "0.02")


def progress_lines(err: str, command: str) -> list[re.Match[str]]:
    assert "\r" not in err and "\x1b" not in err  # plain lines: no carriage return, no colour
    got = [LINE.match(x) for x in err.splitlines()]
    return [m for m in got if m is not None and m.group(1) == command]


def test_a_plain_line_carries_done_total_rate_and_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with Progress("check", 4, "configs", summary=lambda: "2 found") as p:
        p.advance(note="exploring x")
        time.sleep(0.15)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) >= 2 and lines[0].startswith("kvown check: 1/4 configs, 0 s, ")
    assert "left (exploring x; 2 found)" in lines[0]  # an estimate while not done
    assert lines[-1].startswith("kvown check: 1/4 configs")  # the last one, at the end


def test_a_command_shorter_than_one_tick_writes_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVOWN_PROGRESS_SECONDS", "30")
    with Progress("check", 1, "configs") as p:
        p.advance()
    assert capsys.readouterr().err == ""


def test_check_writes_progress_to_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", "offload_contend", "--json"]) == 0
    got = progress_lines(capsys.readouterr().err, "check")
    assert got and all(m.group(4) == "1" for m in got)


def test_prove_counts_its_z3_tasks_and_its_table_says_the_same(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import model_checks.symbolic.claims as claims

    def run_all(groups: Any, quick: bool, jobs: int, on_done: Any) -> list[Any]:
        out = []
        for k, _ in enumerate(claims.tasks(groups, quick)):
            time.sleep(0.03)
            got = [claims.Claim(f"bmc:fake{k}:{j}", "bmc", "proved", 0.0, "proved", ok=True)
                   for j in range(2)]  # fmt: skip
            out += got
            on_done(got)
        return out

    monkeypatch.setattr(claims, "run_all", run_all)
    assert main(["prove", "--only", "bmc"]) == 0
    got = capsys.readouterr()
    n = len(claims.tasks(("bmc",), False))
    lines = progress_lines(got.err, "prove")
    assert lines and {m.group(4) for m in lines} == {str(n)}
    assert lines[-1].group(2) == str(n)
    assert f"{2 * n} claims (from {n} z3 tasks)" in got.out


def test_fuzz_writes_progress_per_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvown_cli.fuzz as fuzz
    from refimpl.testing.run import RunResult

    def hunt(adapter: Any, name: str, **kw: Any) -> RunResult:
        time.sleep(0.1)
        return RunResult(name, ())

    monkeypatch.setattr(fuzz, "hunt", hunt)
    assert main(["fuzz", "--config", "offload_contend", "--json"]) == 0
    assert progress_lines(capsys.readouterr().err, "fuzz")


def test_cluster_writes_progress_and_ctrl_c_says_how_far(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import refimpl.cluster.router as router

    def run_cluster(cfg: Any, progress: Any) -> Any:
        for k in range(3):
            progress(k + 1, cfg.requests, {"finished": k + 1})
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(router, "run_cluster", run_cluster)
    assert main(["cluster", "--requests", "5", "--json"]) == 130
    err = capfd.readouterr().err
    assert progress_lines(err, "cluster")
    assert "kvown cluster: interrupted after 3/5 requests" in err


def test_the_clusters_estimate_leaves_out_the_workers_start_up(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers took 40 s to start and the first request 2 s more: 19 requests are left
    at 2 s each, about 38 s (it said 'about 13 min left', the start-up counted per request)."""
    import kvown_cli.progress as progress_mod
    import refimpl.cluster.router as router

    clock = [1000.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    seen: list[str] = []

    def run_cluster(cfg: Any, progress: Any) -> Any:
        clock[0] += 40.0  # the workers start (before the serve loop's first report)
        progress(0, cfg.requests, {"finished": 0})
        clock[0] += 2.0
        progress(1, cfg.requests, {"finished": 1})
        seen.append(progress_mod._CURRENT[-1].line())
        raise KeyboardInterrupt

    monkeypatch.setattr(router, "run_cluster", run_cluster)
    assert main(["cluster", "--requests", "20", "--json"]) == 130
    capfd.readouterr()
    assert seen and "about 38 s left" in seen[0], seen


def _mutant_result(k: int) -> Any:
    from model_checks.mutation.operators import Mutant
    from model_checks.mutation.runner import KILLED, MutantResult

    m = Mutant(f"m{k}", "refimpl/x.py", k + 1, "negate", "a -> not a", "", "")
    return MutantResult(m, {"fuzz": KILLED}, {}, 0.05)


def test_mutate_prints_its_plan_an_estimate_and_ctrl_c_the_tally(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvown_cli.mutate as mutate

    def run_mutants(root: Any, picked: Any, checks: Any, **kw: Any) -> Any:
        print("started", file=__import__("sys").stderr)
        for k in range(3):
            time.sleep(0.05)
            kw["on_result"](_mutant_result(k))
        raise KeyboardInterrupt

    from types import SimpleNamespace

    from model_checks.mutation import Check

    fake = SimpleNamespace(  # a target of 40 mutants (the real one takes 20 s to generate)
        name="refimpl",
        root=Path("."),
        copy=("refimpl",),
        checks=(Check("fuzz", ("true",)),),
        mutants=lambda: [_mutant_result(k).mutant for k in range(40)],
        load_equivalents=dict,
    )
    monkeypatch.setattr(mutate, "_build", lambda args: fake)
    monkeypatch.setattr(mutate, "run_mutants", run_mutants)
    assert main(["mutate", "--target", "refimpl", "--sample", "5", "--jobs", "2"]) == 130
    err = capfd.readouterr().err
    plan = r"^kvown mutate: plan: 5 of 40 mutants, 2 at a time, judged by fuzz"
    assert re.search(plan, err, re.M), err
    assert err.index("plan:") < err.index("started")  # the plan comes before the work
    estimate = r"estimate: \d+ s per mutant \(the first 2, .*\), about .* for the other 3"
    assert re.search(estimate, err)
    assert progress_lines(err, "mutate")
    assert "kvown mutate: interrupted after 3/5 mutants" in err and "killed 3" in err


def test_repro_calls_a_script_that_does_not_apply_skipped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvown_cli.repro as repro

    def run_one(name: str, narrate: bool) -> dict[str, object]:
        time.sleep(0.03)
        rec: dict[str, object] = {"name": name, "property": "P", "ok": True}
        if name == "reload_on_critical_stream":
            return {**rec, "damage": "n/a on CPU", "prevented": "n/a on CPU", "skipped": "n/a"}
        return {**rec, "damage": "d", "prevented": "p"}

    monkeypatch.setattr(repro, "run_one", run_one)
    monkeypatch.setattr("refimpl.replay.prefetch", lambda names: None)
    assert main(["repro", "--all"]) == 0
    got = capsys.readouterr()
    n = len(repro.script_names())
    assert "skip reload_on_critical_stream: P" in got.out
    assert f"{n - 1} of {n - 1} that ran behave as documented" in got.out
    assert "skipped, not run (not applicable here): 1: reload_on_critical_stream: n/a" in got.out
    assert progress_lines(got.err, "repro")


def test_an_n_a_script_is_recorded_skipped() -> None:
    import torch

    from kvown_cli.repro import run_one

    rec = run_one("reload_on_critical_stream", narrate=False)
    if torch.cuda.is_available():
        assert "skipped" not in rec
    else:
        assert rec["skipped"] == "n/a on CPU" and rec["ok"] is True


def test_piped_tables_keep_full_names(capsys: pytest.CaptureFixture[str]) -> None:
    from kvown_cli.listing import vocabulary

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    v = vocabulary()
    names = [r["name"] for r in v["mutants"]] + [r["id"] for r in v["properties"]]  # type: ignore[attr-defined]
    names += [r["name"] for r in v["configs"]]  # type: ignore[attr-defined]
    for name in names:
        assert re.search(rf"│ {re.escape(name)} +│", out), name


def test_check_junit_times_add_up_to_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    xml = tmp_path / "check.xml"
    assert main(["check", "--config", "offload_contend", "--json", "--junit", str(xml)]) == 0
    run = sum(c["seconds"] for c in json.loads(capsys.readouterr().out)["configs"])
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite is not None
    cases = sum(float(c.get("time", "0")) for c in suite.findall("testcase"))
    assert abs(float(suite.get("time", "-1")) - run) < 0.01 + 0.001 * len(suite)
    assert abs(cases - run) < 0.01 + 0.001 * len(suite)
