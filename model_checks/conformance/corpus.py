"""The mutated-log corpus: every log of ``repro/traces`` with one event edited.

Issue #21 measures the share of ``Unmodelled`` verdicts on it. ``edits`` gives each
one-event edit of a log (its header kept): an event dropped, doubled, or swapped with the
next one (the issue's measure), and, with ``epochs=True``, a message's epoch moved by
one (a message of another attempt). ``corpus`` walks the logs in name order, so the
corpus is the same on every run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"
CONFORMING = ("ok_", "fixed_")  # the logs the figure mutates


def _epoch(line: str, delta: int) -> str | None:
    try:
        e = json.loads(line)
    except ValueError:
        return None
    args = e.get("args") if isinstance(e, dict) else None
    if not isinstance(args, dict) or type(args.get("epoch")) is not int:
        return None
    if args["epoch"] + delta < 1:
        return None
    return json.dumps({**e, "args": {**args, "epoch": args["epoch"] + delta}})


def edits(lines: list[str], *, epochs: bool = False) -> list[tuple[str, list[str]]]:
    """Each event line (1-based numbers; line 1 is the header) dropped, doubled, or
    swapped with the next one; with ``epochs``, each message's epoch moved by +1 and -1."""
    out: list[tuple[str, list[str]]] = []
    for k in range(1, len(lines)):
        out.append((f"drop {k + 1}", lines[:k] + lines[k + 1 :]))
        out.append((f"double {k + 1}", lines[: k + 1] + lines[k:]))
        if k + 1 < len(lines):
            swapped = [*lines[:k], lines[k + 1], lines[k], *lines[k + 2 :]]
            out.append((f"swap {k + 1}", swapped))
        for delta in (1, -1) if epochs else ():
            moved = _epoch(lines[k], delta)
            if moved is not None:
                out.append((f"epoch{delta:+d} {k + 1}", [*lines[:k], moved, *lines[k + 1 :]]))
    return out


def logs(prefixes: tuple[str, ...] = CONFORMING, root: Path = TRACES) -> list[Path]:
    """The logs of ``root`` whose names start with one of ``prefixes``, in name order."""
    return sorted(p for p in root.glob("*.jsonl") if p.name.startswith(prefixes))


def corpus(
    prefixes: tuple[str, ...] = CONFORMING, *, epochs: bool = False, root: Path = TRACES
) -> Iterator[tuple[str, str, str]]:
    """(log name, edit, edited log text) for every log and every one-event edit."""
    for p in logs(prefixes, root):
        for what, text in edits(p.read_text().splitlines(), epochs=epochs):
            yield p.name, what, "\n".join(text)
