"""Docs change with the code: every repository path the docs name (in backticks, from a
top-level folder) exists, so a move that forgets a doc fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("spec", "model_checks", "refimpl", "kvown_cli", "tests", "repro", "benchmarks", "examples")
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "spec").glob("*.md"), *(ROOT / "benchmarks").glob("*.md")]
    + [*(ROOT / "repro").rglob("*.md"), *(ROOT / "examples").rglob("*.md")]
)
PATH = re.compile("`((?:" + "|".join(TOPS) + r")/[A-Za-z0-9_./{},-]*)`")


def _named(doc: Path) -> list[str]:
    out = []
    for m in PATH.finditer(doc.read_text()):
        p = m.group(1).split("::")[0].rstrip("/.,")
        if "{" in p or "*" in p:  # a pattern such as `tests/{spec, cli}`
            continue
        out.append(p)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = [p for p in _named(doc) if not (ROOT / p).exists()]
    assert missing == []


def test_the_docs_name_paths_at_all() -> None:
    assert sum(len(_named(d)) for d in DOCS) >= 30
