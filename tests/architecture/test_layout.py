"""The house rules of issue #17, kept by the suite: files of at most 400 lines, folders of
at most 15 Python files, no upward import between the layers, no import cycle, and every
package stating its purpose and its public names."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
# The layers, lowest first: a package may import its own layer and those below it.
LAYERS = ("spec", "model_checks", "refimpl", "kvown_cli")
SCRIPTS = ("repro", "benchmarks", "examples", "tests")  # users of the library, never used
OURS = (*LAYERS, *SCRIPTS)
MAX_LINES, MAX_FILES = 400, 15


def _py_files() -> list[Path]:
    out = []
    for top in OURS:
        out += [p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(out)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, top_level_only: bool) -> Iterator[str]:
    """Absolute names imported by ``path`` (relative imports resolved); with
    ``top_level_only``, only those run at import time (not in functions or TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]

    def walk(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
        for n in nodes:
            yield n
            if isinstance(n, ast.If):
                if not (top_level_only and _is_type_checking(n)):
                    yield from walk(n.body)
                yield from walk(n.orelse)
            elif isinstance(n, ast.Try):
                yield from walk(n.body)
                for h in n.handlers:
                    yield from walk(h.body)
                yield from walk(n.orelse)
                yield from walk(n.finalbody)
            elif not top_level_only and hasattr(n, "body"):
                yield from walk([c for c in ast.walk(n) if isinstance(c, ast.stmt) and c is not n])

    for n in walk(tree.body):
        if isinstance(n, ast.Import):
            yield from (a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = package[: len(package) - (n.level - 1)]
                base = ".".join([*up, base] if base else up)
            yield base
            yield from (f"{base}.{a.name}" for a in n.names)


FILES = _py_files()
MODULES = {_module(p): p for p in FILES}


def test_no_file_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in FILES
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_folder_holds_more_than_15_python_files() -> None:
    per_dir: dict[Path, int] = {}
    for p in FILES:
        per_dir[p.parent] = per_dir.get(p.parent, 0) + 1
    crowded = {str(d.relative_to(ROOT)): n for d, n in per_dir.items() if n > MAX_FILES}
    assert crowded == {}


@pytest.mark.parametrize("layer", LAYERS)
def test_no_upward_import(layer: str) -> None:
    rank = LAYERS.index(layer)
    above = set(LAYERS[rank + 1 :]) | set(SCRIPTS)
    bad = []
    for p in FILES:
        if p.relative_to(ROOT).parts[0] != layer:
            continue
        for name in _imports(p, top_level_only=False):
            if name.split(".")[0] in above:
                bad.append(f"{p.relative_to(ROOT)} imports {name}")
    assert bad == []


def test_no_import_cycle() -> None:
    # Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so a module
    # depends on every package above what it imports (``refimpl.tiers.host`` importing
    # ``refimpl.api.geometry`` once ran ``refimpl/api/__init__``, which imported
    # ``refimpl.tiers.host`` back: ``import refimpl.tiers.host`` alone failed).
    g = nx.DiGraph()
    for mod, p in MODULES.items():
        if p.relative_to(ROOT).parts[0] not in LAYERS:
            continue
        g.add_node(mod)
        for name in _imports(p, top_level_only=True):
            parts = name.split(".")
            for k in range(2, len(parts) + 1):
                dep = ".".join(parts[:k])
                if dep in MODULES and dep != mod and not mod.startswith(dep + "."):
                    g.add_edge(mod, dep)
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert cycles == []


PACKAGES = sorted(
    m for m, p in MODULES.items() if p.name == "__init__.py" and m.split(".")[0] in LAYERS
)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_states_its_purpose_and_public_names(package: str) -> None:
    tree = ast.parse(MODULES[package].read_text())
    doc = ast.get_docstring(tree)
    assert doc and len(doc.split()) >= 5, f"{package}: no docstring saying what it is for"
    mod = importlib.import_module(package)
    names = getattr(mod, "__all__", None)
    assert isinstance(names, list | tuple) and names, f"{package}: no __all__"
    assert len(set(names)) == len(names), f"{package}: a name twice in __all__"
    missing = [n for n in names if not hasattr(mod, n)]
    assert missing == [], f"{package}: __all__ names what it lacks"


def test_refimpl_lazily_re_exports_exactly_the_api() -> None:
    import refimpl
    import refimpl.api

    api = set(refimpl.api.__all__)
    assert api <= set(refimpl.__all__)
    assert {
        n for n in refimpl.__all__ if getattr(refimpl, n) is getattr(refimpl.api, n, None)
    } == api


def test_no_two_test_files_share_a_name() -> None:
    """pytest (rootdir mode, no __init__.py) refuses to collect two test modules of one
    basename: the whole run stops at collection."""
    seen: dict[str, list[str]] = {}
    for p in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert {n: ps for n, ps in seen.items() if len(ps) > 1} == {}


def test_a_public_function_named_like_its_submodule_stays_the_function() -> None:
    # ``handoff``/``offload`` are functions of ``refimpl.api`` and submodules of the same
    # name: once a submodule has run (``refimpl.api.handoff``, as any caller of ``Handoff``
    # imports it), the import system sets it on the package, and ``from refimpl.api import
    # handoff`` gave the module ("'module' object is not callable"). In a fresh interpreter.
    code = (
        "import refimpl.api.handoff, refimpl.api.offload, refimpl.api.sender\n"
        "from refimpl.api import handoff, offload, Sender\n"
        "from refimpl import handoff as h2\n"
        "import types\n"
        "bad = [f for f in (handoff, offload, h2) if isinstance(f, types.ModuleType)]\n"
        "assert not bad, bad\n"
        "assert callable(handoff) and callable(offload) and isinstance(Sender, type)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
