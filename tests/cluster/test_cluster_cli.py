"""``kvown cluster``'s command line: every hostile value is refused before a process
starts (exit 2, one ``error:`` line, with ``--json`` an ``{"error"}`` object), and
``--help`` names the mutants that have a cluster switch. No process is started here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvown_cli.main import main
from kvown_cli.usage import MAX_LINE
from refimpl.cluster.router import CLUSTER_MUTANTS
from spec.mutants import MUTANTS

FILE = str(Path(__file__).resolve())
HOSTILE: tuple[tuple[str, ...], ...] = (
    ("--deadline", "nan"),
    ("--deadline", "inf"),
    ("--deadline=-1",),
    ("--deadline", "0"),
    ("--layers", "100000"),
    ("--layers", "0"),
    ("--requests", "0"),
    ("--requests", "1e3"),
    ("--requests", "100001"),
    ("--prefill-tp", "5"),
    ("--decode-tp", "3"),  # does not divide the model's 2 KV heads
    ("--decode-tp", "5"),
    ("--decode-workers", "5"),
    ("--restarts", "9"),
    ("--retries", "5"),
    ("--cancel", "1.5"),
    ("--cancel", "nan"),
    ("--drop", "-0.1"),
    ("--delay", "inf"),
    ("--delay-ms", "inf"),
    ("--delay-ms", "1e9"),
    ("--timeout", "601"),
    ("--timeout", "0"),
    ("--seed=-1",),
    ("--steps", "257"),
    ("--max-inflight", "0"),
    ("--block-size", "65"),
    ("--head-dim", "7"),
    ("--kv-heads", "100"),
    ("--kill", "bogus"),
    ("--kill", "prefill:2@10%"),
    ("--kill", "decode:3@5%"),
    ("--kill", "decode@100%"),
    ("--kill", "decode:0.1@5%"),  # decode rank 1 without --decode-tp 2
    ("--kill", "x" * 10_000),
    ("--mutant", "nope"),
    ("--mutant", "mismatch_installed"),
    ("--mutant", "\x1b[2J"),
    ("--log-dir", ""),
    ("--log-dir", FILE),
    ("--log-dir", "/proc/self/nonexistent/x"),
    ("--no-such-option",),
)


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("argv", HOSTILE, ids=lambda a: "_".join(a)[:40])
def test_a_hostile_cluster_option_is_refused_before_any_process(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], as_json: bool
) -> None:
    rc = main(["cluster", *argv, *(["--json"] if as_json else [])])
    got = capsys.readouterr()
    assert rc == 2, got.err
    lines = got.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: kvown cluster"), lines[:3]
    assert lines[0].isprintable() and len(lines[0]) <= MAX_LINE + 40
    if as_json:
        assert "error" in json.loads(got.out)
    else:
        assert got.out == ""


def test_help_names_the_mutants_with_a_cluster_switch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for m in CLUSTER_MUTANTS:
        assert f"{m} ({MUTANTS[m].expected})" in text
    assert f"the other {len(MUTANTS) - len(CLUSTER_MUTANTS)} spec mutants" in text


def test_readme_option_table_is_the_commands() -> None:
    """README's cluster option table names real options with their real bounds."""
    import argparse
    import re

    from kvown_cli.cluster import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    opts = {s: a for a in p._actions for s in a.option_strings}
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("## A cluster of processes", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| `--")]
    named = {o for r in rows for o in re.findall(r"`(--[a-z-]+)", r.split(" | ")[0])}
    assert named >= {"--prefill-tp", "--decode-tp", "--decode-workers", "--kill"}, named
    assert named <= set(opts), named - set(opts)
    for opt, lo, hi in (("--prefill-tp", 1, 4), ("--decode-tp", 1, 4), ("--decode-workers", 1, 4)):
        row = next(r for r in rows if r.startswith(f"| `{opt} "))
        assert f"({lo}..{hi}" in row, row
        assert main(["cluster", opt, str(hi + 1), "--json"]) == 2  # the bound is the parser's
