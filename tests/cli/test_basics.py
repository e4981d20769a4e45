"""What a new user meets first (issue #26): ``kvown --version``, ``python -m kvown``, a bare
``kvown`` printing the usage, a closed stdout ending quietly, and every option of every
command described with its default shown."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kvown_cli.main import COMMANDS, _Formatter, _Parser, main, version

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"kvown {PYPROJECT['project']['version']}\n"
    assert version() == PYPROJECT["project"]["version"]


def test_python_dash_m_kvown_is_the_kvown_command() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kvown", "--version"], cwd=ROOT, env=ENV, capture_output=True
    )
    assert r.returncode == 0 and r.stdout.decode().startswith("kvown "), r
    # and the installed package carries it
    assert "kvown" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]


def test_bare_kvown_prints_the_usage_on_stderr_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err.startswith("usage: kvown COMMAND [options]")
    for name in COMMANDS:
        assert f"  {name} " in got.err, name
    assert got.err.strip().splitlines()[-1].startswith("error: kvown: no command")


def closed_stdout(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """``kvown ARGV >&-``: the command run with its stdout closed."""
    line = f"{sys.executable} -m kvown_cli.main {' '.join(argv)} >&-"
    return subprocess.run(line, shell=True, cwd=ROOT, env=ENV, capture_output=True)


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["--version"], ["--help"]])
def test_a_closed_stdout_ends_quietly_with_0(argv: list[str]) -> None:
    """``kvown list >&-``: no output to write to, no error, exit 0."""
    r = closed_stdout(*argv)
    assert r.returncode == 0 and r.stderr == b"", r.stderr


def test_a_closed_stdout_keeps_a_violations_exit_code() -> None:
    r = closed_stdout("check", "--mutant", "failed_store_visible")
    assert r.returncode == 1 and b"error" not in r.stderr


def _parser(name: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"kvown {name}", formatter_class=_Formatter)
    importlib.import_module(COMMANDS[name][0]).add_arguments(p)
    return p


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_and_shows_its_default(name: str) -> None:
    p = _parser(name)
    text = " ".join(p.format_help().split())
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        assert a.help and len(a.help) > 3, f"kvown {name} {a.option_strings or a.dest}: no help"
        d = a.default
        if not a.option_strings or d is None or isinstance(d, bool) or d == []:
            continue  # a positional, a flag, or an option whose absence its help explains
        # the help shows the default: "(default: X)" or the help's own "default X"
        helped = " ".join(p._get_formatter()._expand_help(a).split())  # type: ignore[attr-defined]
        assert "default" in helped and str(d) in helped, f"kvown {name} {a.option_strings}"
        assert helped in text


def test_mutate_help_shows_the_min_kill_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "exit 1 below this kill rate (default: 0.9)" in out
    assert "(default: all for refimpl, 120 for spec)" in out
