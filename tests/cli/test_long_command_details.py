"""The smaller promises of issue #35: fuzz --help shows its budgets' defaults, prove
--mutant names a property's kind truly, no NumPy warning from the library or the seed
example without numpy, the transformers example names the extra it needs, and a skipped
repro script is counted done but left out of the rate its progress line reads the time
left from."""

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


def test_prove_mutant_names_the_property_kind(capsys: pytest.CaptureFixture[str]) -> None:
    # every safety mutant is a BMC claim (slot_reused_unfenced too, since its step on
    # every request is traced): only a liveness one is refused, by its property's kind
    name = "sweep_only_on_admit"
    assert main(["prove", "--mutant", name]) == 2
    err = capsys.readouterr().err
    assert PROPERTIES[MUTANTS[name].expected].kind == "liveness"
    assert "a liveness property" in err, err


def test_the_library_without_numpy_prints_no_numpy_warning() -> None:
    r = _py("import sys; sys.modules['numpy'] = None\nimport refimpl, torch\nprint('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok"
    assert "NumPy" not in r.stderr, r.stderr


def test_the_seed_example_without_numpy_prints_no_numpy_warning() -> None:
    code = (
        "import sys, runpy; sys.modules['numpy'] = None\n"
        "sys.argv = ['kv_offload_pd.py']\n"
        "runpy.run_path('examples/kv_offload_pd.py', run_name='__main__')"
    )
    r = _py(code)
    assert r.returncode == 0 and "roundtrip_max_abs_diff=0.000e+00" in r.stdout, r.stderr
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


def test_a_skipped_item_is_counted_done_but_left_out_of_the_rate() -> None:
    from kvown_cli.progress import Progress

    p = Progress("x", 3, "scripts", enabled=False)
    p.start_work()
    p.skip()  # a script that does not apply: done at once, no work measured
    assert p.body().startswith("1/3 scripts") and "left" not in p.body()
    p.t_work -= 10.0  # then one script that ran took 10 s
    p.advance()
    body = p.body()
    assert body.startswith("2/3 scripts") and "about 10 s left" in body, body  # not 5 s


def test_repro_reports_a_skipped_script_to_its_progress_as_skipped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvown_cli.repro as repro
    from kvown_cli.progress import Progress

    calls: list[str] = []

    class Spy(Progress):
        def advance(self, n: int = 1, note: str | None = None) -> None:
            calls.append("advance")
            super().advance(n, note)

        def skip(self, n: int = 1, note: str | None = None) -> None:
            calls.append("skip")
            super().skip(n, note)

    def run_one(name: str, narrate: bool) -> dict[str, object]:
        rec: dict[str, object] = {"name": name, "property": "P", "ok": True}
        if name == "reload_on_critical_stream":
            return {**rec, "damage": "n/a on CPU", "prevented": "n/a", "skipped": "n/a on CPU"}
        return {**rec, "damage": "d", "prevented": "p"}

    monkeypatch.setattr(repro, "Progress", Spy)
    monkeypatch.setattr(repro, "run_one", run_one)
    monkeypatch.setattr("refimpl.replay.prefetch", lambda names: None)
    assert main(["repro", "--all", "--json"]) == 0
    capsys.readouterr()
    assert calls.count("skip") == 1 and calls.count("advance") == len(repro.script_names()) - 1
