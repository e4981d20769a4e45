"""The README's library example runs as printed (its last line asserts the handoff)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_library_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## As a library") :]
    code = section[section.index("```python\n") + 10 : section.index("```\n", 10)]
    assert "handoff(" in code and "assert " in code
    exec(compile(code, "README.md", "exec"), {})
