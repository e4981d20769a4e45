"""The mutation engine (``model_checks.mutation``) on a toy package: each operator makes
the edit it names, ids survive edits elsewhere in the file, and the runner tells a
killed mutant from a survivor and a timeout, each in its own process on a copy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from model_checks.mutation import Check, generate, load_equivalents, run_mutants, sample, summarise
from model_checks.mutation.equivalents import EquivalentsError

TOY = '''"""Toy."""

LIMIT = 3


def admit(n: int, ok: bool) -> int:
    if n < LIMIT and ok:
        return n
    if not ok:
        raise ValueError("refused")
    total = [n]
    total.append(1)
    total.sort()
    return sum(total)
'''


def _toy(tmp: Path, text: str = TOY) -> Path:
    (tmp / "toy").mkdir(exist_ok=True)
    (tmp / "toy" / "__init__.py").write_text("")
    (tmp / "toy" / "core.py").write_text(text)
    return tmp


def test_every_operator_makes_its_edit(tmp_path: Path) -> None:
    ms = generate(_toy(tmp_path), ["toy/core.py"])
    edits = {(m.operator, m.description) for m in ms}
    assert ("drop_conjunct", "`n < LIMIT and ok` -> `ok`") in edits
    assert ("drop_conjunct", "`n < LIMIT and ok` -> `n < LIMIT`") in edits
    assert ("negate_compare", "`n < LIMIT` -> `n >= LIMIT`") in edits
    assert ("flip_boundary", "`n < LIMIT` -> `n <= LIMIT`") in edits
    assert ("drop_not", "`not ok` -> `ok`") in edits
    assert ("shift_const", "`3` -> `4`") in edits and ("shift_const", "`1` -> `0`") in edits
    assert ("drop_raise", "`raise ValueError('refused')` -> `pass`".replace("'", '"')) in edits
    assert ("drop_return", "`return n` -> `pass`") in edits
    assert ("drop_assign", "`total = [n]` -> `pass`") in edits
    assert ("drop_call", "`total.sort()` -> `pass`") in edits
    swap = "`total.append(1) | total.sort()` -> `total.sort() | total.append(1)`"
    assert ("swap_stmts", swap) in edits
    assert not any(m.operator == "swap_stmts" and "total = [n]" in m.description for m in ms)
    assert not any(m.operator == "drop_return" and m.line == 14 for m in ms)  # the last one
    assert not any(m.operator == "drop_assign" and "LIMIT" in m.description for m in ms)
    for m in ms:  # one edit: the diff removes and adds lines around one place
        assert m.diff.startswith("--- a/toy/core.py\n+++ b/toy/core.py\n")
        compile(m.source, m.file, "exec")


def test_ids_are_stable_when_other_lines_move(tmp_path: Path) -> None:
    before = {m.id: m.description for m in generate(_toy(tmp_path), ["toy/core.py"])}
    moved = TOY.replace('"""Toy."""\n', '"""Toy."""\n\nimport os  # a new line above\n')
    after = {m.id: m.description for m in generate(_toy(tmp_path, moved), ["toy/core.py"])}
    assert before.items() <= after.items()
    assert len(set(before)) == len(before)


def test_no_mutate_comment_and_docstrings_are_skipped(tmp_path: Path) -> None:
    text = TOY.replace("    total.sort()\n", "    total.sort()  # no-mutate\n")
    ms = generate(_toy(tmp_path, text), ["toy/core.py"])
    assert not any("total.sort()" in m.description for m in ms)
    assert not any("Toy" in m.description for m in ms)


def test_sample_is_reproducible_and_bounded(tmp_path: Path) -> None:
    ms = generate(_toy(tmp_path), ["toy/core.py"])
    assert sample(ms, 5, seed=1) == sample(ms, 5, seed=1)
    assert len(sample(ms, 5)) == 5 and sample(ms, 10**6) == sorted(
        ms, key=lambda m: (m.file, m.line, m.id)
    )
    with pytest.raises(ValueError, match="sample size"):
        sample(ms, -1)


def test_the_runner_kills_spares_and_times_out(tmp_path: Path) -> None:
    root = _toy(tmp_path)
    (root / "check_toy.py").write_text(
        "import sys, time\nfrom toy.core import admit\n"
        "if admit(5, True) == 999: time.sleep(60)\n"
        "sys.exit(0 if admit(1, True) == 1 and admit(5, True) == 6 else 1)\n"
    )
    ms = {m.description: m for m in generate(root, ["toy/core.py"])}
    picked = [
        ms["`n < LIMIT` -> `n >= LIMIT`"],  # admit(1) = 2: killed
        ms["`3` -> `4`"],  # same answers for 1 and 5: survives
        ms["`1` -> `0`"],  # admit(5) = 5: killed
    ]
    check = Check("toy", (sys.executable, "check_toy.py"), timeout_s=30)
    res = run_mutants(root, picked, [check], copy=["toy", "check_toy.py"], jobs=2)
    assert [r.outcomes["toy"] for r in res] == ["killed", "survived", "killed"]
    assert (root / "toy" / "core.py").read_text() == TOY  # the original is untouched
    rep = summarise(res, {})
    assert (rep["mutants"], rep["killed"], rep["equivalent"]) == (3, 2, 0)
    assert [s["id"] for s in rep["survivors"]] == [picked[1].id]  # type: ignore[index,union-attr]
    rep = summarise(res, {picked[1].id: "LIMIT is only compared with 1 and 5"})
    assert (rep["killed"], rep["equivalent"], rep["survivors"]) == (2, 1, [])


def test_a_check_past_its_timeout_is_a_timeout(tmp_path: Path) -> None:
    root = _toy(tmp_path)
    (root / "slow.py").write_text("import time\ntime.sleep(30)\n")
    m = generate(root, ["toy/core.py"])[0]
    res = run_mutants(
        root,
        [m],
        [Check("slow", (sys.executable, "slow.py"), timeout_s=1)],
        copy=["toy", "slow.py"],
    )
    assert res[0].outcomes == {"slow": "timeout"} and res[0].status() == "timeout"


def test_equivalents_need_a_reason(tmp_path: Path) -> None:
    p = tmp_path / "eq.json"
    p.write_text(json.dumps({"a:b:c": "why"}))
    assert load_equivalents(p) == {"a:b:c": "why"}
    p.write_text(json.dumps({"a:b:c": " "}))
    with pytest.raises(EquivalentsError, match="non-empty reason"):
        load_equivalents(p)
    assert load_equivalents(tmp_path / "missing.json") == {}


SWITCHED = """
def step(m: frozenset[str], x: int) -> int:
    if "bug" in m and x > 0:
        x = x * 2
    if "other" not in m:
        return x + 1
    x = x - 5
    return x
"""


def test_code_only_a_bug_switch_runs_is_left_alone(tmp_path: Path) -> None:
    ms = generate(_toy(tmp_path, SWITCHED), ["toy/core.py"], switches={"bug", "other"})
    got = {m.description for m in ms}
    assert "`\"bug\" in m` -> `'bug' not in m`" in got  # turns the bug on: live
    assert '`"bug" in m and x > 0` -> `x > 0`' in got  # so does dropping the switch
    assert not any("x * 2" in d or "x - 5" in d or "`x > 0` ->" in d for d in got)
    assert "`\"other\" not in m` -> `'other' in m`" in got
    unswitched = {m.description for m in generate(tmp_path, ["toy/core.py"])}
    assert any("x * 2" in d for d in unswitched) and any("x - 5" in d for d in unswitched)


UNITS = """from __future__ import annotations


class Pool:
    class Inner:
        def size(self, n: int) -> int:
            return n + 1

    @staticmethod
    def take(n: int) -> int:
        y = 0

        def g() -> int:
            nonlocal y
            return y

        return g() + n


def top(n: int) -> int:
    return n
"""


def _agree(rel: str, src: bytes, spans: list[tuple[int, int, str]]) -> bool:
    """``_compiles`` (a function alone when the edit is inside one) says what compiling
    the whole edited file says; returns that."""
    import ast

    from model_checks.mutation.operators import _apply, _compiles, _units

    new = _apply(src, spans)
    try:
        compile(new.decode(), rel, "exec")
        whole = True
    except SyntaxError:
        whole = False
    assert _compiles(rel, src, new, spans, _units(ast.parse(src), src)) is whole, spans
    return whole


def test_an_edit_inside_a_function_compiles_as_the_whole_file_does() -> None:
    """Each of the compiler's refusals, made inside a method, a nested class's method, a
    decorator or at module level, is refused as compiling the whole file refuses it."""
    import ast

    from model_checks.mutation.operators import _units

    src = UNITS.encode()
    units = _units(ast.parse(src), src)  # size, take (its decorator too), top
    assert [(u.head, src[u.lo : u.hi].decode().split("\n")[0]) for u in units] == [
        ("class _:\n    class _:\n", "        def size(self, n: int) -> int:"),
        ("class _:\n", "    @staticmethod"),
        ("", "def top(n: int) -> int:"),
    ]

    def at(old: str, new: str, k: int = 0) -> list[tuple[int, int, str]]:
        i = -1
        for _ in range(k + 1):
            i = src.index(old.encode(), i + 1)
        return [(i, i + len(old.encode()), new)]

    assert _agree("u.py", src, at("return n + 1", "return n - 1"))  # inner class, compiles
    assert not _agree("u.py", src, at("return n + 1", "return n +"))  # syntax
    assert not _agree("u.py", src, at("y = 0", "pass"))  # no binding for nonlocal 'y'
    assert not _agree("u.py", src, at("return g() + n", "return await g()"))  # not async
    assert not _agree("u.py", src, at("@staticmethod", "@(yield)"))  # yield in a class body
    assert not _agree("u.py", src, at("    return n\n", "    return n\n  x = 1\n", 0))  # dedent
    assert _agree("u.py", src, at("return n", "return -n", 1))  # a top-level function
    head = "from __future__ import annotations\n"  # not in a function: the whole file
    assert not _agree("u.py", src, at(head, "x = 1\n" + head))
    swap = [*at("y = 0", "return y"), *at("return g() + n", "y = 0")]  # two spans, one unit
    assert _agree("u.py", src, swap)  # a binding after its use is still a binding


def test_a_real_files_edits_compile_alone_as_in_the_file() -> None:
    import ast

    from model_checks.mutation.finder import Finder

    root = Path(__file__).resolve().parents[2]
    for rel in ("refimpl/engine/decode.py", "spec/actions_decode.py"):
        src = (root / rel).read_bytes()
        f = Finder(src)
        f.visit(ast.parse(src))
        assert len(f.edits) > 100
        # every fourth edit here (each compiled twice); every edit of both targets nightly
        assert all(_agree(rel, src, list(e.spans)) for e in f.edits[::4])


@pytest.mark.nightly
def test_every_targets_edits_compile_alone_as_in_the_file() -> None:
    """Every edit of both targets' files (8,368 on 2026-12-07, each compiled twice)."""
    import ast

    import model_checks.mutation.spec_target as st
    from model_checks.mutation.finder import Finder
    from refimpl.testing.mutate import target

    t = target(unit=False)
    for rel in dict.fromkeys([*t.files, *st.FILES]):
        src = (t.root / rel).read_bytes()
        f = Finder(src, frozenset(t.switches))
        f.visit(ast.parse(src))
        for e in f.edits:
            _agree(rel, src, list(e.spans))
