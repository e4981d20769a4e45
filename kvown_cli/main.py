"""The ``kvown`` command line. Each subcommand lives in its own module with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; only the chosen one is imported
(the refimpl ones import torch, which the model checks do not need).

One exit-code contract for every command (the README's table):

- 0: everything holds / conforms / behaves as documented;
- 1: a property is violated, a log deviates, a claim or a reproduction fails;
- 2: bad input or usage: one line on stderr starting ``error:`` (with ``--json`` also an
  ``{"error": ...}`` object on stdout); also an output that cannot be written;
- 3: an internal error (a bug in kvown): one ``error: internal error`` line, never 1
  (``KVOWN_DEBUG=1`` shows the traceback instead);
- 4: (``check``) the state bound reached: a verdict on the states explored only;
- 130: interrupted (Ctrl-C, SIGTERM or SIGHUP): one line, every child process ended
  (``model_checks.children``: also when kvown itself is killed); a command not ended by
  its own way out ``FORCE_S`` after the signal, or at a second one, ends itself at once.

A closed stdout (``kvown list | head -1``, ``kvown check-trace bug.jsonl | true``,
``kvown list >&-``) drops the rest of the output quietly, and the exit code is the
command's own: a violation stays 1 (``kvown_cli.usage``). An output file that cannot be
written after the work is one ``error:`` line; it makes a 0 a 2 and leaves a 1 a 1.
``kvown --version`` prints the version; a bare ``kvown`` prints the usage on stderr and
exits 2 (as argparse does for a missing subcommand). Ctrl-C during a long command also
prints what was done so far.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn

from kvown_cli import usage as outcome
from kvown_cli.interrupt import lifetime, watch
from kvown_cli.usage import UsageError, one_line, refuse

COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("kvown_cli.check", "explore the spec exhaustively (default suite)"),
    "list": ("kvown_cli.listing", "list actions, properties, mutants and configs"),
    "prove": ("kvown_cli.prove", "z3: BMC of mutants, inductive invariants, layouts"),
    "check-trace": ("kvown_cli.check_trace", "check an engine event log (JSONL)"),
    "demo": ("kvown_cli.demo", "the data path on a real attention model"),
    "fuzz": ("kvown_cli.fuzz", "fuzz the reference implementation against the spec"),
    "repro": ("kvown_cli.repro", "run the failure-case reproduction scripts"),
    "cluster": ("kvown_cli.cluster", "a prefill/decode cluster of processes, checked"),
    "mutate": (
        "kvown_cli.mutate",
        "one-edit mutants of the spec or refimpl, judged by the checkers",
    ),
    "replay": ("kvown_cli.replay", "replay a saved counterexample (check --cex-dir) on the spec"),
}
EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _Formatter(argparse.HelpFormatter):
    """Every option's help shows its default, unless the help names it already or there is
    none to show (a flag, or an option whose absence the help explains)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        d = action.default
        if (
            "default" in text
            or not action.option_strings
            or any(d is x for x in (None, False, True, argparse.SUPPRESS))
            or d == []
        ):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse, but misuse raises UsageError (one line) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _usage() -> str:
    lines = ["usage: kvown COMMAND [options]", "", "commands:"]
    lines += [f"  {name:12s} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines.append("\n`kvown COMMAND --help` for a command's options; `kvown --version`.")
    lines.append(
        "exit codes: 0 holds, 1 violation, 2 bad input, 3 internal error,"
        " 4 state bound reached (check), 130 Ctrl-C"
    )
    return "\n".join(lines)


def _end_children() -> None:
    """End every worker: the registered process groups (mutate's checks, the cluster's
    workers) and the multiprocessing children (z3 claims, the explorer, repro prefetch)."""
    from model_checks import children

    children.end_all()


# While an interrupt is handled, fd 2 points at /dev/null and this is the real stderr:
# ending the workers makes a process pool's manager thread report the broken pool, and
# on Python 3.11 it can die with a traceback (InvalidStateError on a future that the
# interrupted ``map`` cancelled; CPython gh-107219, seen on CI's 3.11.7). One line only.
_REAL_STDERR: list[int] = []
_KEEP_MUTED = False  # the executable exits at once after the line; main() restores fd 2


def _mute_stderr() -> None:
    if _REAL_STDERR:
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except (OSError, ValueError):
        return
    _REAL_STDERR.append(saved)


def _partial(wait_s: float | None = None) -> str | None:
    """What the interrupted command had done (its progress line), if it had a progress."""
    progress = sys.modules.get("kvown_cli.progress")
    return None if progress is None else progress.partial(wait_s)


def _say_interrupted(name: str, done: str | None = None) -> None:
    _SAID.append(True)
    line = f"{('kvown ' + name).strip()}: interrupted" + (f" after {done}" if done else "") + "\n"
    if not _REAL_STDERR:
        print(line, end="", file=sys.stderr)
        return
    try:
        os.write(_REAL_STDERR[0], line.encode())
    except OSError:
        pass


def _unmute_stderr() -> None:
    if not _REAL_STDERR or _KEEP_MUTED:
        return
    saved = _REAL_STDERR.pop()
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os.dup2(saved, 2)
    os.close(saved)


# The bound on an interrupt's end: the command's own cleanup normally takes well under a
# second (the cluster's workers' grace: seconds at load); a timer armed by the first signal
# ends the process after FORCE_S whatever the main thread is stuck in (a C call that never
# returns, a swallowed interrupt), with the same line; a second signal ends it at once.
FORCE_S = 5.0
_FORCE: list[threading.Timer] = []
_SAID: list[bool] = []
_NAME: list[str] = [""]


def _force_exit() -> None:
    """End now: the workers, the one line (unless said), exit 130. The folders and groups
    left are the watchdog's (``model_checks.children``), which sees this process end."""
    _mute_stderr()
    _end_children()
    if not _SAID:  # what was done, unless the main thread holds the progress's lock
        _say_interrupted(_NAME[0], _partial(wait_s=0.5))
    os._exit(EXIT_INTERRUPTED)


def _arm_forced_exit() -> None:
    timer = threading.Timer(FORCE_S, _force_exit)
    timer.daemon = True
    _FORCE.append(timer)
    timer.start()


def _disarm_forced_exit() -> None:
    watch.reset()
    while _FORCE:
        _FORCE.pop().cancel()


def _on_landed(n: int) -> None:
    """A signal as it landed (``interrupt.watch``): the first arms the forced exit, a
    second ends the process now, even while the main thread is inside a C call."""
    if n >= 2:
        _force_exit()
    if not _FORCE:
        _arm_forced_exit()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    from model_checks import children

    if not watch.watching():  # else the watcher armed it (or ended us) as it landed
        _on_landed(2 if _FORCE else 1)
    if children.defer_interrupt():  # a child is starting: popen raises once it is known
        return
    if lifetime.in_import(frame):  # torch's C++ aborts on a raise in its import: end now
        _force_exit()
    _mute_stderr()  # then end the workers: a pool's shutdown would otherwise wait for them
    _end_children()
    raise KeyboardInterrupt


def _install_signal_handlers() -> None:
    """Ctrl-C, SIGTERM and SIGHUP end the workers and the command, exit 130 (unless ignored)."""
    from model_checks import children

    children.install()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # unless ignored
        h = signal.getsignal(sig)
        if h in (signal.default_int_handler, signal.SIG_DFL) or lifetime.installed(h):
            signal.signal(sig, _on_sigint)
    watch.start(_on_landed)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def version() -> str:
    """The installed package's version; from a checkout not installed, pyproject's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("kvown")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, ValueError):
            return "unknown"


def _reopen_closed_std() -> None:
    """A closed fd 1 or 2 (``kvown list >&-``): Python set sys.stdout/err to None. Point the
    fd at /dev/null, so the command runs, its output is dropped and its exit code stands."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115
        except OSError:
            pass


def main(argv: Sequence[str] | None = None) -> int:
    _reopen_closed_std()
    saved = outcome.guard_stdout()  # a reader that goes away never changes the exit code
    try:
        return _main(argv)
    finally:
        sys.stdout = saved


_ENTRY_START: list[float] = []  # the executable's process start (``entry``)


def _main(argv: Sequence[str] | None) -> int:
    # A budget counts from here: the process's start for the executable, else this call.
    outcome.start_clock(_ENTRY_START[0] if _ENTRY_START else None)
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(_usage())
        return EXIT_OK
    if args and args[0] in ("-V", "--version"):
        print(f"kvown {version()}")
        return EXIT_OK
    if not args:
        print(_usage(), file=sys.stderr)
        return _fail("", f"no command; valid commands: {', '.join(COMMANDS)}", False)
    name = args[0]
    as_json = "--json" in args[1:]
    if name not in COMMANDS:
        return _fail("", f"unknown command {name!r}; valid: {', '.join(COMMANDS)}", as_json)
    _NAME[0] = name  # from here a signal's line names the command
    _SAID.clear()
    from model_checks import children

    children.begin()  # an earlier command's end_all stopped new work; this one may start
    if threading.current_thread() is threading.main_thread():
        _install_signal_handlers()
    # torch warns at import when numpy is absent; kvown never needs numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    outcome.set_command(name)
    try:
        rc = _dispatch(name, args[1:], as_json)
        sys.stdout.flush()
        return outcome.final(rc)
    except KeyboardInterrupt:
        _mute_stderr()
        _end_children()
        _say_interrupted(name, _partial())
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into `head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_OK
    except UsageError as exc:
        return _fail(name, str(exc), as_json)
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            _silence_stdout()
            return EXIT_OK
        _silence_stdout()
        print(f"error: kvown {name}: {one_line(_os_message(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug in kvown: never exit 1 ("violation found")
        _end_children()
        if os.environ.get("KVOWN_DEBUG"):
            raise
        msg = one_line(f"internal error (a bug in kvown): {type(exc).__name__}: {exc}")
        print(f"error: kvown {name}: {msg}", file=sys.stderr)
        if as_json:
            print(json.dumps({"error": msg, "internal": True}))
        return EXIT_INTERNAL
    finally:
        _disarm_forced_exit()
        _unmute_stderr()


def _os_message(exc: OSError) -> str:
    where = f" {exc.filename}" if exc.filename else " output"
    return f"cannot use{where}: {exc.strerror or exc}"


def _fail(name: str, msg: str, as_json: bool) -> int:
    if not name:
        print(f"error: kvown: {one_line(msg)}", file=sys.stderr)
        return EXIT_USAGE
    return refuse(name, msg, as_json)


def _raise_broken_pipe(self: object) -> None:
    raise BrokenPipeError(errno.EPIPE, "stdout closed")


def _dispatch(name: str, argv: list[str], as_json: bool) -> int:
    import rich.console

    # rich turns a closed stdout into SystemExit(1), the code for "violation found";
    # let it reach main's BrokenPipeError handler (quiet exit 0) instead.
    setattr(rich.console.Console, "on_broken_pipe", _raise_broken_pipe)  # noqa: B010
    module_name, help_ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"not available ({exc})") from None
    parser = _Parser(prog=f"kvown {name}", description=help_, formatter_class=_Formatter)
    module.add_arguments(parser)
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:  # --help: argparse printed it and exits 0
        return int(exc.code or 0)
    result: int = module.run(ns)
    return result


def entry() -> NoReturn:
    """The ``kvown`` executable: ``main``, then ``lifetime.end`` (exit without the teardown
    of torch and Hypothesis); a signal outside the command's handling: the one line, 130."""
    global _KEEP_MUTED
    _KEEP_MUTED = True
    _ENTRY_START[:] = [outcome.process_started()]
    try:
        rc = main()
    except KeyboardInterrupt:
        _end_children()
        if not _SAID:
            _say_interrupted(_NAME[0])
        rc = EXIT_INTERRUPTED
    lifetime.end(rc)


if __name__ == "__main__":
    entry()
