"""Every third-party import of the shipped packages is declared in pyproject.toml.

A module-level import must be a core dependency (``pip install -e .`` brings it); an
import inside a function or a ``try: ... except ImportError`` may come from an extra.
The standard library and the project's own packages aside, anything else fails here, so
the next undeclared import (numpy was one) fails in the suite, not on a user's machine.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("spec", "refimpl", "model_checks", "kvown_cli")
# import name -> distribution name, where they differ
DISTRIBUTION = {"z3": "z3-solver", "yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn"}


def _dist(requirement: str) -> str:
    name = re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0]
    return name.lower().replace("_", "-")


def declared() -> tuple[set[str], set[str]]:
    """(core dependencies, dependencies of any extra), as normalised distribution names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_dist(r) for r in project.get("dependencies", [])}
    extras = {_dist(r) for reqs in project.get("optional-dependencies", {}).values() for r in reqs}
    return core, extras


def _guarded(node: ast.Try) -> bool:
    names = ("ImportError", "ModuleNotFoundError")
    return any(
        h.type is not None and any(n in ast.unparse(h.type) for n in names) for h in node.handlers
    )


def imports(tree: ast.Module) -> Iterator[tuple[str, bool, int]]:
    """(top-level module name, imported at module level unguarded?, line) per import."""

    def walk(node: ast.AST, top: bool) -> Iterator[tuple[str, bool, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield a.name.split(".")[0], top, child.lineno
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module.split(".")[0], top, child.lineno
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, False)
            elif isinstance(child, ast.Try) and _guarded(child):
                yield from walk(child, False)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from walk(child, False)
            else:
                yield from walk(child, top)

    yield from walk(tree, True)


def undeclared(sources: dict[str, str], core: set[str], extras: set[str]) -> list[str]:
    """Every import of ``sources`` (path -> text) that pyproject does not declare."""
    first_party = set(PACKAGES)
    bad = []
    for path, text in sources.items():
        for name, top, line in imports(ast.parse(text)):
            if name in sys.stdlib_module_names or name in first_party or name == "__future__":
                continue
            dist = DISTRIBUTION.get(name, name).lower().replace("_", "-")
            if dist in core or (not top and dist in extras):
                continue
            where = "a core dependency" if top else "a dependency or extra"
            bad.append(f"{path}:{line}: import {name} is not declared as {where}")
    return bad


def _sources() -> dict[str, str]:
    return {
        str(f.relative_to(ROOT)): f.read_text()
        for pkg in PACKAGES
        for f in sorted((ROOT / pkg).rglob("*.py"))
    }


def test_every_third_party_import_is_declared() -> None:
    sources = _sources()
    assert len(sources) > 40  # the packages were found
    core, extras = declared()
    assert undeclared(sources, core, extras) == []


def test_the_check_catches_an_undeclared_import() -> None:
    core, extras = declared()
    fake = {
        "refimpl/x.py": "import numpy as np\nfrom z3 import Solver\n",
        "refimpl/y.py": "def f():\n    import pandas\n",
        "refimpl/z.py": "try:\n    import numpy\nexcept ImportError:\n    numpy = None\n",
        "refimpl/w.py": "import os\nimport json\nfrom spec import config\nimport torch\n",
    }
    got = undeclared(fake, core, extras)
    assert got == [
        "refimpl/x.py:1: import numpy is not declared as a core dependency",
        "refimpl/y.py:2: import pandas is not declared as a dependency or extra",
        "refimpl/z.py:2: import numpy is not declared as a dependency or extra",
    ]


def test_the_core_dependencies_are_the_ones_the_design_names() -> None:
    core, _ = declared()
    assert {"torch", "networkx", "z3-solver", "xxhash", "rich", "hypothesis"} <= core
    assert "numpy" not in core  # torch and xxhash do the data path's byte work
