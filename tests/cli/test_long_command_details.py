"""The smaller promises of issue #35: fuzz --help shows its budgets' defaults, prove
--mutant names a property's kind truly, no NumPy warning from the library without numpy,
and the transformers example names the extra it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvown_cli.main import main
from spec.mutants import MUTANTS
from spec.properties import PROPERTIES

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _py(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV
    )


def test_fuzz_help_shows_the_budgets_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "100 per config, 500 per switch" in text
    assert "a hard time budget" in text and "(default: none" in text


@pytest.mark.parametrize("name", ["sweep_only_on_admit", "slot_reused_unfenced"])
def test_prove_mutant_names_the_property_kind(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prove", "--mutant", name]) == 2
    err = capsys.readouterr().err
    kind = PROPERTIES[MUTANTS[name].expected].kind
    assert f"a {kind} property" in err, err
    assert ("liveness" in err) == (kind == "liveness")


def test_the_library_without_numpy_prints_no_numpy_warning() -> None:
    r = _py("import sys; sys.modules['numpy'] = None\nimport refimpl, torch\nprint('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok"
    assert "NumPy" not in r.stderr, r.stderr


def test_the_hf_example_without_transformers_names_the_extra() -> None:
    code = (
        "import sys, runpy; sys.modules['transformers'] = None\n"
        "sys.argv = ['hf_llama_handoff.py']\n"
        "runpy.run_path('examples/hf_llama_handoff.py', run_name='__main__')"
    )
    r = _py(code)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "[hf] extra" in r.stderr, r.stderr


def test_the_rate_is_measured_from_the_work_not_the_start_up() -> None:
    import time

    from kvown_cli.progress import Progress

    p = Progress("x", 10, "units", enabled=False)
    p.t0 = p.t_work = time.monotonic() - 100.0  # a 100 s one-off start-up ...
    p.start_work()
    p.t_work -= 1.0  # ... then 5 units in 1 s
    p.advance(5)
    body = p.body()
    assert "about 1 s left" in body, body  # not the 100 s the start-up would say


def test_a_skipped_script_is_not_called_as_documented(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("the CUDA-stream script runs on a GPU")
    assert main(["repro", "reload_on_critical_stream"]) == 0
    out = capsys.readouterr().out
    assert "verdict:   skipped, not run here (n/a on CPU)" in out
    assert "behaves as documented" not in out.replace("0 of 0 that ran behave", "")
    assert "skipped, not run (not applicable here): 1: reload_on_critical_stream" in out
