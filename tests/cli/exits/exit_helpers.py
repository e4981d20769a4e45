"""What the exit tests share: a child with SIGINT at its default, and the live processes
of a process group read from /proc (Linux)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def as_a_terminal_gives_it() -> None:
    """SIGINT at its default in the child: a shell's background job (``cmd &`` in a
    script, as a CI runner may start the suite) ignores SIGINT, and an ignored signal is
    inherited across exec, so Python would not install its Ctrl-C handler at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def group(pgid: int) -> list[int]:
    """Live processes of a process group (zombies excluded)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(d))
    return pids
