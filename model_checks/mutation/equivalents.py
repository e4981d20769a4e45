"""The reviewed equivalents list: mutants that cannot change behaviour, each with a reason.

A JSON object ``{"<mutant id>": "<why no program can tell it from the original>"}``.
An entry without a non-empty reason is an error: the list is reviewed, not a dump.
"""

from __future__ import annotations

import json
from pathlib import Path


class EquivalentsError(ValueError):
    """The equivalents file is malformed (the message names the file and the entry)."""


def load_equivalents(path: Path) -> dict[str, str]:
    """The ``{id: reason}`` map of ``path`` (empty when the file does not exist)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EquivalentsError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise EquivalentsError(f"{path}: expected an object of id -> reason")
    out: dict[str, str] = {}
    for k, v in data.items():
        if not isinstance(v, str) or not v.strip():
            raise EquivalentsError(f"{path}: entry {k[:80]!r} needs a non-empty reason")
        out[k] = v
    return out
