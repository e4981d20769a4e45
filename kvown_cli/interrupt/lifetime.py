"""The ``kvown`` executable's first and last moments (stdlib only: it runs before the
imports).

**Start-up.** ``kvown_cli/__init__`` calls ``install`` when the process is the executable
(``kvown``, ``python -m kvown_cli.main``, ``python -m kvown``), before anything else of
kvown is imported: from there until ``kvown_cli.main`` installs its own handlers, Ctrl-C,
SIGTERM or SIGHUP ends the process at once with one line, ``kvown COMMAND: interrupted``,
exit 130 (nothing has started that needs ending: no worker, no file). Before, a signal in
the imports printed Python's KeyboardInterrupt traceback (exit 1 or killed by SIGINT).
What no kvown code can cover is the interpreter's own start-up before that first line
(its init and ``site``, which runs the installed ``.pth`` files: about 30 ms, 0.1 s or
more on a loaded machine with an editable install): a signal there ends Python as
Python does.

**Exit.** ``end(rc)`` after the command said its result: the standard streams flushed,
the ``atexit`` handlers run (logging, multiprocessing's children, ``weakref.finalize``
such as temporary folders), then ``os._exit(rc)``, skipping the interpreter's teardown
of every module (torch, Hypothesis, the explorer's graphs: 1.5 to 2 s of CPU at load 5,
4 to 7 s at load 15, after the result was printed). Only where that is safe: every file
kvown writes is closed by its own ``with`` or ``finally`` before ``main`` returns, and a
non-daemon thread still running (a thread or process pool not shut down) means work may
be unfinished: then the interpreter's ordinary exit joins it.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from types import FrameType
from typing import NoReturn

__all__ = ["end", "in_import", "install", "installed", "is_executable"]

EXIT_INTERRUPTED = 130
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def is_executable() -> bool:
    """This process is the ``kvown`` command: its script, or ``python -m kvown_cli...``
    (``sys.argv[0]`` is ``-m`` while ``-m`` imports the package)."""
    arg0 = sys.argv[0] if sys.argv else ""
    return arg0 == "-m" or os.path.basename(arg0) == "kvown"


def _command() -> str:
    """The command's name as typed, when it is one word of letters (else none)."""
    word = sys.argv[1] if len(sys.argv) > 1 else ""
    return f" {word}" if word.replace("-", "").isalpha() and len(word) <= 20 else ""


def _interrupted(signum: int, frame: FrameType | None) -> None:
    try:
        os.write(2, f"kvown{_command()}: interrupted\n".encode())
    except OSError:
        pass
    os._exit(EXIT_INTERRUPTED)


def install() -> None:
    """One line and exit 130 on SIGINT/SIGTERM/SIGHUP from now on, for a signal at its
    default (an ignored one stays ignored: a background job's SIGINT)."""
    for sig in _SIGNALS:
        default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        if signal.getsignal(sig) is default:
            signal.signal(sig, _interrupted)


def installed(handler: object) -> bool:
    """``handler`` is this module's (``main`` takes it as the default it may replace)."""
    return handler is _interrupted


def in_import(frame: FrameType | None) -> bool:
    """The main thread is inside an import (a module's code, or a C extension's init that
    calls back into Python). A KeyboardInterrupt raised there does not unwind cleanly:
    torch's import aborted the process (a pybind11 callback: ``terminate called after
    throwing``, SIGABRT), or left a C extension half loaded (the command then failed with
    "cannot load module more than once per process", exit 2). ``main`` ends the command at
    once instead (its forced exit: the workers ended, the one line, 130)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _safe_to_skip_teardown() -> bool:
    main = threading.main_thread()
    return all(t is main or t.daemon or not t.is_alive() for t in threading.enumerate())


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a reader gone: the exit code stands (``kvown_cli.usage``)


def end(rc: int) -> NoReturn:
    """Exit with ``rc`` now that the command said its result (see the module's doc)."""
    for sig in _SIGNALS:  # a signal from here on: one line, 130, no traceback
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):
            signal.signal(sig, _interrupted)
    _flush()
    if rc == EXIT_INTERRUPTED:  # the workers are ended, the line said: at once, as before
        os._exit(rc)
    if not _safe_to_skip_teardown():
        raise SystemExit(rc)
    atexit._run_exitfuncs()
    _flush()
    os._exit(rc)
