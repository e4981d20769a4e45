"""``kvown mutate --target refimpl``: one-edit mutants of the engine, judged by the fuzzer.

The mutated files are the ones the fuzzer drives: every ``refimpl`` module the engine
imports (``refimpl/engine/`` and what it imports, found from the source), plus
``refimpl/reshard.py`` (driven by ``datapath``'s block-table fuzz). Left out, by scope:

    AbstractMap.damaged / committed_bytes_ok   the engine's own data self-check; the
                                               harness's ghost (``ghost.py``) is the oracle
    AbstractMap.fingerprint                    what "a refusal changes nothing" compares
    AbstractMap.check_integrity,               self-checks: a weaker check changes no
    BlockAllocator.check_integrity             behaviour, a stricter one fails at once
    EngineBase.describe                        message text

and code that only a bug switch runs (``model_checks.mutation``: ``switches``).

Checks, each in its own process on a copy of the repository, in this order; ``kvown
mutate`` stops a mutant's run at the first check that kills it:

    tour   ``python -m refimpl.testing.mutate tour``: the graph tour (``tour``) of every
           edge of the worlds of ``TOURS``, deterministic, to the first divergence.
    fuzz   ``python -m refimpl.testing.mutate fuzz``: the data-path fuzz (``datapath``:
           block tables, the receiver's faults, the transport's ``Inbox``), then the
           Hypothesis machine on every world of ``FUZZ_WORLDS`` (ci profile,
           derandomised), to the first failure.
    unit   ``pytest tests/refimpl`` (engine, chunk, transport, block, pool, reshard,
           model tests): reported as its own column, not counted.

``python -m refimpl.testing.mutate lines`` runs the tour and the fuzz check on the
unmutated code with a line tracer on the mutated files and prints the lines they execute
(JSON): ``kvown mutate`` reports the mutants on the other lines as not covered, without
running them (no check can kill them).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from model_checks.mutation import Check, Target

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENTS = ROOT / "refimpl" / "testing" / "equivalents.json"
FUZZ_EXAMPLES = 30  # per world, for each mutant
TOURS = ("offload_contend", "async_handoff", "crash_both", "restart_handoff")  # edge tours
EXCLUDE = (
    "refimpl.engine.abstract.AbstractMap.damaged",
    "refimpl.engine.abstract.AbstractMap.committed_bytes_ok",
    "refimpl.engine.abstract.AbstractMap.fingerprint",
    "refimpl.engine.abstract.AbstractMap.check_integrity",
    "refimpl.blocks.BlockAllocator.check_integrity",
    "refimpl.engine.base.EngineBase.describe",
)
EXTRA = ("refimpl/reshard.py",)


def engine_files(root: Path = ROOT) -> tuple[str, ...]:
    """``refimpl/engine/*.py`` and every ``refimpl`` module they import, transitively."""
    todo = sorted(p.relative_to(root).as_posix() for p in (root / "refimpl/engine").glob("*.py"))
    seen: set[str] = set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for mod in mods:
                if not mod.startswith("refimpl."):
                    continue
                base = root / mod.replace(".", "/")
                for cand in (base.with_suffix(".py"), base / "__init__.py"):
                    if cand.exists():
                        todo.append(cand.relative_to(root).as_posix())
                        break
    return tuple(sorted(seen | set(EXTRA)))


def target(*, unit: bool = True, examples: int = FUZZ_EXAMPLES, timeout_s: float = 600) -> Target:
    from spec.mutants import MUTANTS

    py = sys.executable
    checks = [
        Check("tour", (py, "-m", "refimpl.testing.mutate", "tour"), timeout_s=timeout_s),
        Check(
            "fuzz",
            (py, "-m", "refimpl.testing.mutate", "fuzz", "--examples", str(examples)),
            timeout_s=timeout_s,
        ),
    ]
    if unit:
        # -n 0: in the check's own process (the mutants already run --jobs at a time)
        unit_argv = (py, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider")
        unit_argv += ("tests/refimpl",)
        checks.append(Check("unit", unit_argv, timeout_s=timeout_s, counts=False))
    return Target(
        name="refimpl",
        root=ROOT,
        files=engine_files(),
        copy=("spec", "model_checks", "refimpl", "tests", "pyproject.toml"),
        checks=tuple(checks),
        equivalents=EQUIVALENTS,
        exclude=EXCLUDE,
        switches=(*MUTANTS, "reload_on_critical_stream"),
    )


# --------------------------------------------------------------------- the checks
def tour_check() -> int:
    """Exit status of the tour column: 0 when every edge tour of ``TOURS`` conforms, 1 at
    the first divergence (its kind and first line on stdout)."""
    from refimpl.testing import EngineAdapter
    from refimpl.testing.tour import plan_tour, run_tour
    from refimpl.testing.worlds import get_world

    adapter = EngineAdapter()
    for name in TOURS:
        res = run_tour(adapter, plan_tour(get_world(name), "edges"))
        if res.failure is not None:
            first = str(res.failure).splitlines()[0]
            print(f"killed on {name} by the tour, {res.failure.kind}: {first[:300]}")
            return 1
    print("survived")
    return 0


def lines_argv(examples: int = FUZZ_EXAMPLES) -> tuple[str, ...]:
    """The command that prints ``covered_lines`` (``kvown mutate`` runs it once)."""
    return (sys.executable, "-m", "refimpl.testing.mutate", "lines", "--examples", str(examples))


def covered_lines(examples: int, root: Path = ROOT) -> dict[str, list[int]]:
    """The lines of the mutated files that the tour and the fuzz check execute on the
    unmutated code (a line tracer on those files only)."""
    files = {os.path.realpath(root / f): f for f in engine_files(root)}
    hit: dict[str, set[int]] = {f: set() for f in files.values()}

    real: dict[str, str | None] = {}  # co_filename -> the mutated file's name, or None

    def name_of(co_filename: str) -> str | None:
        got = real.get(co_filename, "")
        if got == "":
            got = real[co_filename] = files.get(os.path.realpath(co_filename))
        return got

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            hit[real[frame.f_code.co_filename] or ""].add(frame.f_lineno)
        return local

    def glob(frame: Any, event: str, arg: Any) -> Any:
        return local if name_of(frame.f_code.co_filename) else None

    sys.settrace(glob)
    threading.settrace(glob)
    try:
        tour_check()
        fuzz_check(examples)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return {f: sorted(v) for f, v in hit.items()}


def fuzz_check(examples: int) -> int:
    """Exit status of the fuzz column: 0 when every check passes, 1 at the first failure
    (its kind and first line on stdout)."""
    from refimpl.testing import EngineAdapter
    from refimpl.testing.datapath import run_datapath
    from refimpl.testing.run import hunt
    from refimpl.testing.worlds import FUZZ_WORLDS, get_world

    problem = run_datapath()
    if problem is not None:
        print(f"killed by datapath: {problem}")
        return 1
    adapter = EngineAdapter()
    for name in FUZZ_WORLDS:
        res = hunt(adapter, get_world(name), profile="ci", examples=examples)
        if res.failure is not None:
            kind = getattr(res.failure, "kind", "") or type(res.failure).__name__
            first = str(res.failure).splitlines()[0] if str(res.failure) else ""
            print(f"killed on {name} by {kind}: {first[:300]}")
            return 1
    print("survived")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m refimpl.testing.mutate")
    p.add_argument("check", choices=["tour", "fuzz", "lines"])
    p.add_argument("--examples", type=int, default=FUZZ_EXAMPLES)
    a = p.parse_args(argv)
    if a.check == "tour":
        return tour_check()
    if a.check == "lines":
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # the checks' own lines
            got = covered_lines(a.examples)
        print(json.dumps(got))
        return 0
    return fuzz_check(a.examples)


if __name__ == "__main__":
    raise SystemExit(main())
