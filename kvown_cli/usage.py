"""Bad input to the ``kvown`` command: one error class, the numeric option types, and the
output-path check that runs before any work.

A command raises :class:`UsageError` for anything the user must fix; ``main`` prints it as
one line starting ``error:`` on stderr (and, with ``--json``, as ``{"error": ...}`` on
stdout) and exits 2. Every message cuts the offending value to a short printable prefix.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from spec.strict_json import short

MAX_SEED: Final = (1 << 63) - 1  # torch.manual_seed takes a 64-bit seed
MAX_STEPS: Final = 10_000  # tokens decoded after a handoff in the demo
MAX_SECONDS: Final = 7 * 24 * 3600.0  # a week: a time budget past it is a typo
MAX_EXAMPLES: Final = 10_000_000
MAX_JOBS: Final = 256  # worker processes; each z3 worker holds its own solver memory
MAX_GAP: Final = 64  # unlogged steps check-trace may assume before one event


class UsageError(Exception):
    """Bad input or usage; exit code 2, with this message as one ``error:`` line."""


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a decimal integer in [lo, hi] (no float, no 5,000-digit literal)."""

    def parse(text: str) -> int:
        plain = text.strip()
        digits = plain.lstrip("+-")
        if not (digits.isdigit() and digits.isascii() and len(digits) <= 20) or (
            len(plain) - len(digits) > 1
        ):
            raise argparse.ArgumentTypeError(f"expected an integer, got {short(text)}")
        v = int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} outside [{lo}, {hi}]")
        return v

    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds in (0, MAX_SECONDS]."""
    if len(text) > 32:
        raise argparse.ArgumentTypeError(f"expected seconds, got {short(text)}")
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {short(text)}") from None
    if not math.isfinite(v) or not 0 < v <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{short(text)} is not a finite time in (0, {MAX_SECONDS}]"
        )
    return v


def output_path(path: str | None, what: str) -> None:
    """Refuse an output path that cannot be written, before the work starts."""
    if path is None:
        return
    if not path or "\0" in path:
        raise UsageError(f"{what}: empty or invalid path")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what}: {short(path)} is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what}: folder {short(str(parent))} does not exist")
    writable = os.access(p, os.W_OK) if p.exists() else os.access(parent, os.W_OK | os.X_OK)
    if not writable:
        raise UsageError(f"{what}: {short(path)} is not writable")


MAX_LINE: Final = 2000  # longest error line printed (a 10 MB bad value never reaches stderr)


def one_line(msg: str) -> str:
    """``msg`` as one printable line of at most MAX_LINE characters."""
    flat = " ".join(msg.split())
    flat = "".join(c if c.isprintable() else f"\\x{ord(c) & 0xFF:02x}" for c in flat)
    return flat if len(flat) <= MAX_LINE else flat[: MAX_LINE - 3] + "..."


def refuse(command: str, msg: str, as_json: bool, **extra: object) -> int:
    """Report bad input the one way: an ``error:`` line on stderr, with ``--json`` also an
    ``{"error": ...}`` object (plus ``extra`` keys) on stdout; return exit code 2."""
    line = one_line(msg)
    print(f"error: kvown {command}: {line}", file=sys.stderr)
    if as_json:
        print(json.dumps({**extra, "error": line}))
    return 2
