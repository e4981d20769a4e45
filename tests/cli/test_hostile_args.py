"""Hostile command lines: every numeric option given values it must refuse, names and
paths that are wrong, huge or full of control characters. Each must end with exit 2,
one printable ``error:`` line of bounded length on stderr, and with ``--json`` an
``{"error": ...}`` object on stdout; none may start the work."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvown_cli.main import main
from kvown_cli.usage import (
    MAX_EXAMPLES,
    MAX_JOBS,
    MAX_LINE,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    int_in,
    positive_seconds,
)

ROOT = Path(__file__).resolve().parents[2]
LOG = str(ROOT / "repro" / "traces" / "ok_handoff.jsonl")

# Refused by every numeric option (ints and seconds alike).
NEVER_A_NUMBER = (
    "nan",
    "NaN",
    "inf",
    "-inf",
    "-1",
    "-0.5",
    "1e309",
    "9" * 5000,
    "0x10",
    "",
    " ",
    "true",
    "[]",
    "1 2",
    "+-1",
    "x" * 100_000,
    "\x1b[31m1",
    "1\n2",
)
NOT_AN_INT = ("1.5", "1e3", "١٢", "1_000", "10000000000000000000000000")
OPTIONS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("demo", "--seed"): NEVER_A_NUMBER + NOT_AN_INT,
    ("demo", "--steps"): (*NEVER_A_NUMBER, *NOT_AN_INT, "0", "100001"),
    ("fuzz", "--seconds"): (*NEVER_A_NUMBER, "0", "-0", "1e7", "0e0"),
    ("fuzz", "--examples"): (*NEVER_A_NUMBER, *NOT_AN_INT, "0"),
    ("prove", "--jobs"): (*NEVER_A_NUMBER, *NOT_AN_INT, "0", "257"),
    ("check-trace", LOG, "--max-gap"): (*NEVER_A_NUMBER, "65", "1" + "0" * 30),
}
NAMES = ("nope", "", "x" * 100_000, "\x1b[2J\x07", "../../etc/passwd", "-", "é" * 50)
PATHS = ("/nonexistent-dir/out", "/", "", "/proc/self/nonexistent/x")


def hostile_command_lines() -> Iterator[tuple[str, ...]]:
    for prefix, values in OPTIONS.items():
        for v in values:
            yield (
                (*prefix, v)
                if not v.startswith("-") or v == "-"
                else (*prefix[:-1], f"{prefix[-1]}={v}")
            )
    for name in NAMES:
        yield ("check", "--config", name)
        yield ("check", "--mutant", name)
        yield ("prove", "--mutant", name)
        yield ("prove", "--property", name)
        if not name.startswith("-"):
            yield ("repro", name)
        yield ("fuzz", "--profile", name)
        yield ("check-trace", LOG, "--assume", name)
    for path in PATHS:
        yield ("check", "--junit", path)
        yield ("check", "--mutant", "cancel_ignored", "--dot", path)
        yield ("prove", "--junit", path)
        yield ("fuzz", "--junit", path)
        yield ("check-trace", LOG, "--junit", path)
    for command in ("list", "check", "prove", "check-trace", "demo", "fuzz", "repro"):
        yield (command, "--no-such-option")
        yield (command, "--json=1")


CASES = list(hostile_command_lines())


def _assert_clean(rc: int, out: str, err: str, as_json: bool) -> None:
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, lines[:3]
    line = lines[0]
    assert line.startswith("error:") and line.isprintable() and len(line) <= MAX_LINE + 40
    if as_json:
        assert "error" in json.loads(out)
    else:
        assert out == ""


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 150
    assert len(set(CASES)) == len(CASES)


@pytest.mark.parametrize("as_json", [False, True])
def test_every_hostile_command_line_is_refused_cleanly(
    capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    for argv in CASES:
        full = [*argv, "--json"] if as_json and "--json=1" not in argv else list(argv)
        rc = main(full)
        got = capsys.readouterr()
        _assert_clean(rc, got.out, got.err, as_json and "--json=1" not in argv)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["--seed", "--steps", "--examples", "--jobs", "--seconds"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
    | st.from_regex(r"\A[+-]?[0-9]{1,25}(\.[0-9]*)?(e[+-]?[0-9]{1,3})?\Z"),
)
def test_a_numeric_option_takes_exactly_the_numbers_in_its_range(option: str, text: str) -> None:
    """Any text: accepted exactly when it is a number of the option's kind in its range."""
    lo, hi, parse = {
        "--seed": (0, MAX_SEED, int_in(0, MAX_SEED)),
        "--steps": (1, MAX_STEPS, int_in(1, MAX_STEPS)),
        "--examples": (1, MAX_EXAMPLES, int_in(1, MAX_EXAMPLES)),
        "--jobs": (1, MAX_JOBS, int_in(1, MAX_JOBS)),
        "--seconds": (0, MAX_SECONDS, positive_seconds),
    }[option]
    try:
        got = parse(text)
    except argparse.ArgumentTypeError:
        got = None
    if option == "--seconds":
        try:
            want: float | None = float(text) if len(text) <= 32 else None
        except ValueError:
            want = None
        if want is not None and not (math.isfinite(want) and lo < want <= hi):
            want = None
    else:
        plain = text.strip()
        digits = plain.lstrip("+-")
        ok = digits.isascii() and digits.isdigit() and len(digits) <= 20
        want = int(plain) if ok and len(plain) - len(digits) <= 1 else None
        if want is not None and not lo <= want <= hi:
            want = None
    assert got == want
