"""The exit code never hides a violation (issue #34, item 3): a reader that closes stdout
keeps the command's own code (1 stays 1; it was 0), an output file that cannot be written
after the work keeps a violation's 1 (and makes a 0 a 2), every bad counterexample file
is 2 (never 3, an internal error), and every ``--json`` refusal prints its ``{"error"}``."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvown_cli.main import main

ROOT = Path(__file__).resolve().parents[3]
BUG = str(ROOT / "repro" / "traces" / "bug_stall_silent.jsonl")
OK = str(ROOT / "repro" / "traces" / "ok_handoff.jsonl")


def _closed_reader(*argv: str) -> int:
    """Run ``kvown ARGV | true``: the reader is gone before the first byte is written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [sys.executable, "-m", "kvown_cli.main", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    assert p.stdout is not None
    p.stdout.close()
    try:
        return p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    ("argv", "rc"),
    [
        (("check-trace", BUG), 1),
        (("check-trace", BUG, "--json"), 1),
        (("check-trace", OK), 0),
        (("check", "--mutant", "cancel_ignored"), 1),
    ],
)
def test_a_closed_stdout_keeps_the_commands_code(argv: tuple[str, ...], rc: int) -> None:
    assert _closed_reader(*argv) == rc


class _Gone:
    """A stdout whose reader has gone: every write and flush is EPIPE."""

    def write(self, s: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_in_process_a_broken_pipe_keeps_the_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", _Gone())
    assert main(["check-trace", BUG]) == 1
    assert main(["check-trace", OK]) == 0


@pytest.mark.parametrize(("log", "rc"), [(BUG, 1), (OK, 2)])
def test_an_output_that_fails_after_the_work_keeps_a_violations_1(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    log: str,
    rc: int,
) -> None:
    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("kvown_cli.junit.os.replace", full)
    junit = tmp_path / "out.xml"
    assert main(["check-trace", log, "--junit", str(junit)]) == rc
    err = capsys.readouterr().err
    assert f"error: kvown check-trace: cannot write {junit}: No space left" in err
    assert not list(tmp_path.iterdir())  # no temp file left either


BAD_CEX = {
    "a step that is not an object": {"config": "handoff_two", "trace": [5]},
    "a step without an action": {"config": "handoff_two", "trace": [{"args": {}}]},
    "args that are not an object": {
        "config": "handoff_two",
        "trace": [{"action": "PrefillAdmit", "args": [0]}],
    },
    "an unhashable violated": {"config": "handoff_two", "violated": [1], "trace": []},
    "a mutant that is not a name": {"config": "handoff_two", "mutant": 5, "trace": []},
}


@pytest.mark.parametrize("what", sorted(BAD_CEX))
def test_every_bad_counterexample_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, what: str
) -> None:
    path = tmp_path / "cex.json"
    path.write_text(json.dumps(BAD_CEX[what]))
    assert main(["replay", str(path), "--json"]) == 2
    got = capsys.readouterr()
    assert "error" in json.loads(got.out) and got.err.startswith("error: kvown replay")


@pytest.mark.parametrize(
    "argv",
    [
        ("mutate", "--sample", "0", "--json"),
        ("mutate", "--target", "spec", "--jobs", "0", "--json"),
        ("mutate", "--min-kill", "2", "--json"),
    ],
)
def test_every_json_refusal_prints_its_error(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    assert main(list(argv)) == 2
    got = capsys.readouterr()
    assert "error" in json.loads(got.out) and got.err.startswith("error: kvown mutate:")
