"""The mutation operators: every one-edit mutant of a Python file, as exact span edits.

``generate_file(root, rel)`` parses ``root/rel`` and yields one ``Mutant`` per edit;
``generate`` does it for many files; ``sample`` picks N of them reproducibly. The
operators, skips and id scheme are described in the package docstring.
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import random
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from model_checks.mutation.finder import Finder

OPERATORS: tuple[str, ...] = (
    "drop_conjunct",
    "drop_disjunct",
    "negate_compare",
    "flip_boundary",
    "drop_not",
    "shift_const",
    "flip_bool",
    "drop_assign",
    "drop_call",
    "drop_raise",
    "drop_return",
    "swap_stmts",
)


@dataclass(frozen=True)
class Mutant:
    """One edit of one file. ``source`` is the whole mutated file."""

    id: str  # stable: "<stem>.<qualname>:<operator>:<hash>"
    file: str  # relative to the root, POSIX separators
    line: int  # 1-based line of the edit
    operator: str  # one of OPERATORS
    description: str  # "`a < b` -> `a >= b`"
    source: str = field(repr=False, compare=False)
    base: str = field(default="", repr=False, compare=False)  # the file before the edit

    @functools.cached_property
    def diff(self) -> str:
        """Unified diff of the file, three lines of context (made when first read: the
        suite reads a few of thousands)."""
        return "".join(
            difflib.unified_diff(
                self.base.splitlines(keepends=True),
                self.source.splitlines(keepends=True),
                f"a/{self.file}",
                f"b/{self.file}",
                n=3,
            )
        )

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "file": self.file, "line": self.line, "diff": self.diff}


def _apply(src: bytes, spans: Sequence[tuple[int, int, str]]) -> bytes:
    out = src
    for lo, hi, new in sorted(spans, reverse=True):
        out = out[:lo] + new.encode() + out[hi:]
    return out


def generate_file(root: Path, rel: str, switches: Collection[str] = ()) -> Iterator[Mutant]:
    """Every mutant of ``root/rel`` that still compiles and changes the text.

    ``switches``: names of the implementation's bug switches (off in every check). Code
    that runs only with one on (the body of ``if "x" in self.m``, the code after ``if "x"
    not in self.m: raise ...``) is not mutated: no check could tell such a mutant apart."""
    path = root / rel
    src = path.read_bytes()
    tree = ast.parse(src, filename=rel)
    finder = Finder(src, frozenset(switches))
    finder.visit(tree)
    stem = Path(rel).with_suffix("").as_posix().replace("/", ".")
    seen: dict[tuple[str, ...], int] = {}
    old_text = src.decode()
    units = _units(tree, src)
    for e in finder.edits:
        new_src = _apply(src, e.spans)
        if new_src == src:
            continue
        new_text = new_src.decode()
        if not _compiles(rel, src, new_src, e.spans, units):
            continue
        orig = " | ".join(src[lo:hi].decode() for lo, hi, _ in e.spans)
        repl = " | ".join(t for _, _, t in e.spans)
        key = (rel, e.qualname, e.op, orig, repl)
        k = seen.get(key, 0)
        seen[key] = k + 1
        h = hashlib.sha1("\0".join((*key, str(k))).encode()).hexdigest()[:8]
        scope = f"{stem}.{e.qualname}" if e.qualname else stem
        yield Mutant(
            id=f"{scope}:{e.op}:{h}",
            file=rel,
            line=e.line,
            operator=e.op,
            description=f"`{_short(orig)}` -> `{_short(repl)}`",
            source=new_text,
            base=old_text,
        )


@dataclass(frozen=True)
class _Unit:
    """A top-level function of a module or a method of its (nested) classes: its bytes,
    decorators included, and the ``class _:`` lines that put it back at its indentation in
    a class body, as in the file."""

    lo: int
    hi: int
    head: str


def _units(tree: ast.Module, src: bytes) -> list[_Unit]:
    """The functions an edit inside can be compiled alone (``_compiles``); none for a
    file indented with tabs or with a future import other than ``annotations``."""
    if b"\t" in src or any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name != "annotations" for a in n.names)
        for n in tree.body
    ):
        return []
    starts = [0]
    for ln in src.splitlines(keepends=True):
        starts.append(starts[-1] + len(ln))
    out: list[_Unit] = []

    def walk(body: list[ast.stmt], head: str) -> None:
        for n in body:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([n.lineno, *(d.lineno for d in n.decorator_list)])
                out.append(_Unit(starts[first - 1], starts[n.end_lineno or n.lineno], head))
            elif isinstance(n, ast.ClassDef):
                walk(n.body, head + " " * n.col_offset + "class _:\n")

    walk(tree.body, "")
    return out


def _compiles(
    rel: str, src: bytes, new_src: bytes, spans: Sequence[tuple[int, int, str]], units: list[_Unit]
) -> bool:
    """Whether ``new_src`` (``src`` with ``spans`` edited) compiles. An edit inside one
    function (``_units``) is compiled as that function alone, in as many class bodies as
    in the file: what lies outside is the file's, which compiled, and what the compiler
    checks of a function (its syntax, its scopes: ``nonlocal`` finds no enclosing function
    in either; ``return``, ``await``, ``yield``) is inside it or is a class body around it.
    The same flags (those of this module: ``annotations``). Any other edit: the whole
    file. tests/fuzz/test_mutation_engine.py checks that both agree on every edit."""
    lo, hi = min(a for a, _, _ in spans), max(b for _, b, _ in spans)
    u = next((u for u in units if u.lo <= lo and hi <= u.hi), None)
    text = (
        new_src.decode()
        if u is None
        else u.head + new_src[u.lo : u.hi + len(new_src) - len(src)].decode()
    )
    try:
        compile(text, rel, "exec")
    except SyntaxError:
        return False
    return True


def _short(s: str, n: int = 80) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def generate(root: Path, files: Sequence[str], switches: Collection[str] = ()) -> list[Mutant]:
    """Every mutant of every file (paths relative to ``root``), sorted by id."""
    out: list[Mutant] = []
    for rel in files:
        out.extend(generate_file(root, rel, switches))
    ids = [m.id for m in out]
    if len(set(ids)) != len(ids):  # pragma: no cover - the hash includes the occurrence
        raise ValueError("mutant ids collide")
    return sorted(out, key=lambda m: m.id)


def sample(mutants: Sequence[Mutant], n: int, seed: int = 0) -> list[Mutant]:
    """``n`` of ``mutants`` (all when ``n`` is at least their number), the same ones for
    the same list and seed, in file and line order."""
    if n < 0:
        raise ValueError(f"sample size must be >= 0, got {n}")
    pool = sorted(mutants, key=lambda m: m.id)
    picked = pool if n >= len(pool) else random.Random(seed).sample(pool, n)
    return sorted(picked, key=lambda m: (m.file, m.line, m.id))
