"""``kvown replay``: a counterexample that ``kvown check --cex-dir`` saved replays on the
spec, step by step, and reports the violated property at the step that breaks it; a
trace the (fixed) spec refuses or that breaks nothing is not reproduced; a bad file is
bad input. And ``kvown check --mutant`` names the incident its mutant is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvown_cli.main import main
from spec.mutants import MUTANTS

# mutants whose model check takes well under a second (safety ones, and a liveness one)
QUICK = (
    "free_on_cancel_in_flight",
    "failed_store_visible",
    "reload_during_store",
    "evict_referenced_prefix",
    "preempt_during_store",
    "source_writes_while_frozen",
    "sweep_only_on_admit",
)


def kvown(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def saved(capsys: pytest.CaptureFixture[str], tmp_path: Path, mutant: str) -> Path:
    rc, _, _ = kvown(capsys, "check", "--mutant", mutant, "--cex-dir", str(tmp_path))
    assert rc == 1
    (path,) = tmp_path.glob("*.json")
    return path


@pytest.mark.parametrize("mutant", QUICK)
def test_a_saved_counterexample_replays_to_its_violation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, mutant: str
) -> None:
    path = saved(capsys, tmp_path, mutant)
    doc = json.loads(path.read_text())
    rc, out, err = kvown(capsys, "replay", str(path), "--json")
    assert rc == 1 and err == ""
    v = json.loads(out)
    assert v["reproduced"] is True
    assert v["violated"] == MUTANTS[mutant].expected == doc["violated"]
    assert v["step"] == len(doc["trace"])  # the shortest trace breaks it at its last step
    assert v["action"] == doc["trace"][-1]["action"]


def test_the_vllm_32255_counterexample_replays_step_by_step(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = saved(capsys, tmp_path, "free_on_cancel_in_flight")
    n = len(json.loads(path.read_text())["trace"])
    rc, out, _ = kvown(capsys, "replay", str(path))
    assert rc == 1
    assert out.startswith("REPRODUCED: config handoff_tp2to1, mutants free_on_cancel_in_flight")
    assert f"step {n} DecodeAbort breaks NoReuseUnderIO" in out
    assert out.rstrip().endswith("=> violates NoReuseUnderIO")
    assert all(f"{k:3d} " in out for k in range(1, n + 1))  # every step shown


def test_without_the_mutant_the_same_trace_is_not_reproduced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = saved(capsys, tmp_path, "free_on_cancel_in_flight")
    rc, out, _ = kvown(capsys, "replay", str(path), "--without-mutants")
    assert rc == 0 and out.startswith("NOT REPRODUCED")


def test_a_cut_trace_is_not_reproduced(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = saved(capsys, tmp_path, "free_on_cancel_in_flight")
    doc = json.loads(path.read_text())
    doc["trace"] = doc["trace"][:-1]
    path.write_text(json.dumps(doc))
    rc, out, _ = kvown(capsys, "replay", str(path), "--json")
    assert rc == 0 and json.loads(out)["reproduced"] is False


def test_a_step_the_spec_refuses_is_not_reproduced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = saved(capsys, tmp_path, "free_on_cancel_in_flight")
    doc = json.loads(path.read_text())
    doc["trace"] = doc["trace"][1:]  # no admission: the first step is not enabled
    path.write_text(json.dumps(doc))
    rc, out, _ = kvown(capsys, "replay", str(path), "--json")
    v = json.loads(out)
    assert rc == 0 and v["reproduced"] is False and v["step"] == 1
    assert "refuses step 1" in v["why"]


def test_the_mutant_output_names_its_incident(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = kvown(capsys, "check", "--mutant", "free_on_cancel_in_flight")
    assert rc == 1 and "vllm #32255" in out
    rc, out, _ = kvown(capsys, "check", "--mutant", "free_on_cancel_in_flight", "--json")
    assert rc == 1 and "vllm #32255" in json.loads(out)["incident"]


BAD = {
    "not JSON": "{nope",
    "not an object": "[1, 2]",
    "no trace": json.dumps({"config": "handoff_tp2to1"}),
    "unknown config": json.dumps({"config": "nope", "trace": []}),
    "unknown mutant": json.dumps({"config": "handoff_tp2to1", "mutants": ["nope"], "trace": []}),
    "unknown action": json.dumps(
        {"config": "handoff_tp2to1", "trace": [{"action": "Nope", "args": {}}]}
    ),
    "bad args": json.dumps(
        {"config": "handoff_tp2to1", "trace": [{"action": "PrefillAdmit", "args": {"req": "x"}}]}
    ),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_a_bad_file_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, what: str
) -> None:
    path = tmp_path / "cex.json"
    path.write_text(BAD[what])
    rc, out, err = kvown(capsys, "replay", str(path))
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: kvown replay")


def test_a_missing_file_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = kvown(capsys, "replay", str(tmp_path / "none.json"), "--json")
    assert rc == 2 and "error" in json.loads(out) and err.startswith("error: kvown replay")


def test_a_file_past_16_mib_is_refused_on_its_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A counterexample is a few KB: the cap is 16 MiB, not 64 (the reader holds about four
    copies of a bracket bomb at once: 60 MB took 328 MB of RSS, past issue #34's 256)."""
    path = tmp_path / "cex.json"
    path.write_bytes(b"[" * ((16 << 20) + 1))
    rc, out, err = kvown(capsys, "replay", str(path))
    assert rc == 2 and "longer than the cap of 16777216 bytes" in err, err


def test_check_trace_given_a_counterexample_points_to_replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = saved(capsys, tmp_path, "free_on_cancel_in_flight")
    rc, _, err = kvown(capsys, "check-trace", str(path))
    assert rc == 2 and f"`kvown replay {path}` replays it" in err


@pytest.mark.parametrize(
    ("flags", "broken"), [((), ["NoReuseUnderIO"]), (("--without-mutants",), [])]
)
def test_the_counterexample_replays_on_the_torch_engine(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: tuple[str, ...], broken: list[str]
) -> None:
    path = saved(capsys, tmp_path, "free_on_cancel_in_flight")
    rc, out, _ = kvown(capsys, "replay", str(path), "--engine", "--json", *flags)
    eng = json.loads(out)["engine"]
    assert rc == (1 if broken else 0)
    assert eng["follows_spec"] is True and eng["steps"] == len(
        json.loads(path.read_text())["trace"]
    )
    assert eng["violated"] == broken
