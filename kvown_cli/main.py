"""The ``kvown`` command line. Each subcommand lives in its own module with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; only the chosen one is imported
(the refimpl ones import torch, which the model checks do not need).

Exit codes: 0 success, 1 a violation or a failed claim, 2 misuse.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("kvown_cli.check", "explore the spec exhaustively (default suite)"),
    "list": ("kvown_cli.listing", "list actions, properties, mutants and configs"),
    "prove": ("kvown_cli.prove", "z3: BMC of mutants, inductive invariants, layouts"),
    "check-trace": ("kvown_cli.check_trace", "check an engine event log (JSONL)"),
    "demo": ("kvown_cli.demo", "the data path on a real attention model"),
    "fuzz": ("kvown_cli.fuzz", "fuzz the reference implementation against the spec"),
    "repro": ("kvown_cli.repro", "run the failure-case reproduction scripts"),
    "mutate": ("kvown_cli.mutate", "one-edit mutants of the code, judged by the checkers"),
}


def _usage() -> str:
    lines = ["usage: kvown COMMAND [options]", "", "commands:"]
    lines += [f"  {name:12s} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines.append("\n`kvown COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name = args[0]
    if name not in COMMANDS:
        print(
            f"kvown: unknown command {name!r}; valid commands: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module_name, help_ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        print(f"kvown {name}: not available ({exc})", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=f"kvown {name}", description=help_)
    module.add_arguments(parser)
    try:
        ns = parser.parse_args(args[1:])
    except SystemExit as exc:  # argparse: misuse exits 2, --help exits 0
        return int(exc.code or 0)
    try:
        result: int = module.run(ns)
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        return 0
    return result


if __name__ == "__main__":
    raise SystemExit(main())
