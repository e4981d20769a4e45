"""The command line every ``repro/<name>.py`` script shares."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from refimpl.replay import Out, Result, guarded


def script_main(run: Callable[[Out | None], Result], argv: list[str] | None = None) -> int:
    """A script's command line: the narration, or with --json only the record. Exit 0
    when the reproduction behaved as documented, 1 otherwise."""
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)
    mod = sys.modules.get(run.__module__)
    name = Path(getattr(mod, "__file__", "repro")).stem
    res = guarded(name, str(getattr(mod, "PROPERTY", "")), run, None if as_json else print)
    if as_json:
        print(json.dumps(res.record()))
    return 0 if res.ok else 1
