"""Line coverage of the spec's mutated files by a suite's exploration, measured once.

A mutant on a line no config of the judging suites ever executes cannot change what the
model check sees: ``kvown mutate --target spec`` reports it as not covered, without a
run (a survivor: the suite never exercises that code). The lines are measured by a
``sys.settrace`` tracer over the correct spec's exploration of every config (only the
frames of the mutated files are traced line by line), and cached in the temporary
folder under a hash of the spec's source and the configs, so a second run reuses them.

A mutant counts as covered when a line of its innermost enclosing statement was
executed (an edit inside a multi-line expression reports no line of its own), and
always when it lies outside every function (module level runs at import).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import spec
from model_checks.explicit.explore import explore
from model_checks.mutation.operators import Mutant
from spec.config import get_config
from spec.strict_json import StrictJSONError, loads_strict

SPEC_DIR = Path(spec.__file__).resolve().parent


def _key(root: Path, files: Sequence[str], configs: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in sorted(SPEC_DIR.rglob("*.py")):  # every spec module: any may change a path
        h.update(p.read_bytes())
    h.update(json.dumps([list(files), list(configs)]).encode())
    return h.hexdigest()[:16]


def measure(root: Path, files: Sequence[str], configs: Iterable[str]) -> dict[str, set[int]]:
    """The lines of ``files`` the exploration of ``configs`` executes (uncached)."""
    want = {str((root / f).resolve()): f for f in files}
    hit: dict[str, set[int]] = {f: set() for f in files}

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            hit[want[frame.f_code.co_filename]].add(frame.f_lineno)
        return local

    def glob(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename in want:
            hit[want[frame.f_code.co_filename]].add(frame.f_lineno)
            return local
        return None

    old = sys.gettrace()
    sys.settrace(glob)
    try:
        for name in configs:
            explore(get_config(name))
    finally:
        sys.settrace(old)
    return hit


def covered_lines(
    root: Path, files: Sequence[str], configs: Sequence[str]
) -> tuple[dict[str, set[int]], bool]:
    """(lines executed per file, whether they came from the cache)."""
    cache = Path(tempfile.gettempdir()) / f"kvown-spec-coverage-{_key(root, files, configs)}.json"
    got = _read_cache(cache, files)
    if got is not None:
        return got, True
    hit = measure(root, files, configs)
    part = cache.with_suffix(f".{os.getpid()}.part")  # whole or absent: two runs may race
    try:
        part.write_text(json.dumps({f: sorted(v) for f, v in hit.items()}))
        os.replace(part, cache)
    except OSError:
        part.unlink(missing_ok=True)
    return hit, False


MAX_CACHE_BYTES = 16 << 20  # line numbers of a few files: a few KB


def _read_cache(cache: Path, files: Sequence[str]) -> dict[str, set[int]] | None:
    """The cached lines of ``files``, or None (recompute) for a cache that is absent,
    unreadable or not what ``covered_lines`` writes. It lies in the shared temporary
    folder, so it is read as untrusted (the one strict reader, a size cap): a deep or huge
    file planted there raised RecursionError or took memory before (issue #34)."""
    try:
        with open(cache, "rb") as fh:
            raw = fh.read(MAX_CACHE_BYTES + 1)
        data = loads_strict(raw, max_bytes=MAX_CACHE_BYTES, max_depth=2, max_int_digits=9)
    except (OSError, StrictJSONError):
        return None
    if not isinstance(data, dict):
        return None
    out: dict[str, set[int]] = {}
    for f in files:
        lines = data.get(f)
        if not isinstance(lines, list) or not all(type(n) is int for n in lines):
            return None
        out[f] = set(lines)
    return out


def _spans(source: str) -> list[tuple[int, int]]:
    """(first, last) line of every statement inside a function, innermost last."""
    out: list[tuple[int, int]] = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for n in ast.walk(fn):
                if isinstance(n, ast.stmt) and n is not fn:
                    out.append((n.lineno, n.end_lineno or n.lineno))
    return out


def uncovered(root: Path, mutants: Sequence[Mutant], hit: dict[str, set[int]]) -> set[str]:
    """Ids of the mutants whose edit no config executes."""
    spans = {f: _spans((root / f).read_text(encoding="utf-8")) for f in hit}
    out: set[str] = set()
    for m in mutants:
        inside = [s for s in spans.get(m.file, ()) if s[0] <= m.line <= s[1]]
        if not inside:
            continue  # module level, or a function's signature: runs at import
        first, last = min(inside, key=lambda s: s[1] - s[0])
        if not hit[m.file] & set(range(first, last + 1)):
            out.add(m.id)
    return out


__all__ = ["covered_lines", "measure", "uncovered"]
