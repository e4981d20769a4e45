"""The exit code stands whatever happens to the output (issue #34): a violation's 1 is
never turned into 0 by a closed stdout, nor into 2 by an output file that cannot be
written after the work.

- ``guard_stdout``: ``sys.stdout`` becomes a wrapper that, once the reader has gone
  (``kvown check-trace bug.jsonl | true``: EPIPE), points fd 1 at /dev/null and drops
  the rest of the output; the command runs to its end and its own code is the exit code.
  (Before, the BrokenPipeError left the command half-way and ``main`` exited 0.)
- ``write_text``: an output file written after the work (``--junit``, ``--dot``,
  ``--cex-dir``); a failure is one ``error:`` line on stderr, noted, and the command goes
  on. ``final(rc)`` is then the exit code: 1 stays 1 (the violation was found and is
  reported), 0 becomes 2 (an output that cannot be written), any other code stands.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, TextIO

from kvown_cli.usage import one_line

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
