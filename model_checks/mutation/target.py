"""A mutation target: which files to mutate, which checks judge a mutant, what to leave out.

``kvown mutate --target NAME`` looks ``NAME`` up in ``kvown_cli.mutate.TARGETS`` (a module
path), imports that module and calls its ``target(unit=..., examples=...)`` to get a
``Target``. To add one (for example ``spec``): write a module with such a function
returning a ``Target`` whose ``checks`` run your checker in a subprocess (exit 0: the
mutant survived), and add one line to ``TARGETS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from model_checks.mutation.equivalents import load_equivalents
from model_checks.mutation.operators import Mutant, generate
from model_checks.mutation.runner import Check


@dataclass(frozen=True)
class Target:
    name: str  # "refimpl", "spec", ...
    root: Path  # the repository root
    files: tuple[str, ...]  # files to mutate, relative to root
    copy: tuple[str, ...]  # what each worker's temporary copy holds
    checks: tuple[Check, ...]  # run in order on each mutant
    equivalents: Path  # the reviewed {id: reason} list
    exclude: tuple[str, ...] = ()  # mutant id prefixes left out (see the target's doc)
    switches: tuple[str, ...] = ()  # bug switch names: code only they turn on is not mutated

    def mutants(self) -> list[Mutant]:
        """Every mutant of ``files``, less the excluded scopes, sorted by id."""
        return [
            m for m in generate(self.root, self.files, self.switches) if not self.excluded(m.id)
        ]

    def excluded(self, mutant_id: str) -> bool:
        scope = mutant_id.split(":", 1)[0]
        return any(scope == p or scope.startswith(p + ".") for p in self.exclude)

    def load_equivalents(self) -> dict[str, str]:
        return load_equivalents(self.equivalents)


def python_files(root: Path, folders: Sequence[str], skip: Sequence[str] = ()) -> tuple[str, ...]:
    """The .py files under ``folders`` (relative to ``root``), less those under ``skip``."""
    out = []
    for f in folders:
        for p in sorted((root / f).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            if not any(rel == s or rel.startswith(s.rstrip("/") + "/") for s in skip):
                out.append(rel)
    return tuple(out)
