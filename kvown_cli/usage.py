"""Bad input to the ``kvown`` command: one error class, the numeric option types, the
output-path check that runs before any work, and the outputs after it (a closed stdout or
an output file that cannot be written never changes a violation's exit code: see "the
exit code stands" below).

A command raises :class:`UsageError` for anything the user must fix; ``main`` prints it as
one line starting ``error:`` on stderr (and, with ``--json``, as ``{"error": ...}`` on
stdout) and exits 2. Every message cuts the offending value to a short printable prefix.

The command's clock (``start_clock``, ``started``, ``since_start``): a time budget counts
from the command's start, which for the ``kvown`` executable is the process's own start
(``process_started``: the interpreter's start-up and the imports of torch count too;
``fuzz --mutant release_keeps_wait --seconds 5`` took 16.9 s when it counted from the
hunt, 12 s of it importing torch on a loaded machine); ``main`` called in a process that
does other work starts it at the call.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TextIO

from spec.strict_json import short

MAX_SEED: Final = (1 << 63) - 1  # torch.manual_seed takes a 64-bit seed
MAX_STEPS: Final = 10_000  # tokens decoded after a handoff in the demo
MAX_SECONDS: Final = 7 * 24 * 3600.0  # a week: a time budget past it is a typo
MAX_EXAMPLES: Final = 10_000_000
MAX_JOBS: Final = 256  # worker processes; each z3 worker holds its own solver memory
MAX_GAP: Final = 64  # unlogged steps check-trace may assume before one event


_STARTED: list[float] = []  # time.monotonic() at the command's start


def process_started() -> float:
    """``time.monotonic()`` at this process's start (Linux: ``/proc/self/stat``'s start
    time against ``/proc/uptime``, to 10 ms); elsewhere, or unreadable: now."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - min(max(0.0, age), MAX_SECONDS)


def start_clock(at: float | None = None) -> None:
    """The command starts now, or at ``at`` (a ``time.monotonic()`` reading)."""
    _STARTED[:] = [time.monotonic() if at is None else at]


def started() -> float:
    """``time.monotonic()`` at the command's start (now, if no command started one)."""
    return _STARTED[0] if _STARTED else time.monotonic()


def since_start() -> float:
    """Seconds since the command's start."""
    return time.monotonic() - started()


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


# ------------------------------------------------------------ the exit code stands
# The exit code stands whatever happens to the output (issue #34): a violation's 1 is
# never turned into 0 by a closed stdout, nor into 2 by an output file that cannot be
# written after the work.
#
# - ``guard_stdout``: ``sys.stdout`` becomes a wrapper that, once the reader has gone
#   (``kvown check-trace bug.jsonl | true``: EPIPE), points fd 1 at /dev/null and drops
#   the rest of the output; the command runs to its end and its own code is the exit code.
#   (Before, the BrokenPipeError left the command half-way and ``main`` exited 0.)
# - ``write_text``: an output file written after the work (``--junit``, ``--dot``,
#   ``--cex-dir``); a failure is one ``error:`` line on stderr, noted, and the command goes
#   on. ``final(rc)`` is then the exit code: 1 stays 1 (the violation was found and is
#   reported), 0 becomes 2 (an output that cannot be written), any other code stands.

_FAILED: list[str] = []  # outputs that could not be written in this command
_COMMAND: list[str] = [""]


class _Guarded:
    """A text stream whose writes never raise for a reader that has gone."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner
        self.gone = False

    def _silence(self) -> None:
        self.gone = True
        try:
            fd = self._inner.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def _guard(self, op: str, *a: Any) -> Any:
        try:
            return getattr(self._inner, op)(*a)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
        self._silence()  # then once more: the buffered bytes go to /dev/null
        try:
            return getattr(self._inner, op)(*a)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            return len(a[0]) if a else None  # no fd to silence: the output is dropped

    def write(self, s: str) -> int:
        n: int = self._guard("write", s)
        return n

    def flush(self) -> None:
        self._guard("flush")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def guard_stdout() -> TextIO:
    """Wrap ``sys.stdout`` (see the module docstring); returns the stream it replaced."""
    _FAILED.clear()
    old = sys.stdout
    if not isinstance(old, _Guarded):
        sys.stdout = _Guarded(old)
    return old


def stdout_gone() -> bool:
    """Whether the reader of stdout went away during this command."""
    return isinstance(sys.stdout, _Guarded) and sys.stdout.gone


def set_command(name: str) -> None:
    _COMMAND[0] = name


def output_failed(path: str, exc: OSError) -> None:
    """Report an output that could not be written (one ``error:`` line) and note it."""
    why = exc.strerror or str(exc)
    _FAILED.append(path)
    name = f"kvown {_COMMAND[0]}" if _COMMAND[0] else "kvown"
    print(f"error: {name}: {one_line(f'cannot write {path}: {why}')}", file=sys.stderr)


def write_text(path: str, text: str) -> bool:
    """Write an output file after the work; False (reported, noted) when it cannot be."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        output_failed(path, exc)
        return False
    return True


def final(rc: int) -> int:
    """The exit code once the command returned ``rc``: an output that failed makes 0 a 2,
    and leaves a violation's 1 (and every other code) as it is."""
    return 2 if _FAILED and rc == 0 else rc
