"""Judging mutants: each in its own process, on a temporary copy of the code, in parallel.

``run_mutants`` gives every worker thread one private copy of ``root``'s folders (made
once, then only the mutated file is rewritten and restored), so N mutants cost N file
writes, not N copies. Each ``Check`` runs as a subprocess in its own process group, so
a timeout ends the check and every child it started; the groups and the copies are
registered with ``model_checks.children`` (an interrupt ends them, the watchdog removes
them if this process is killed), and after an interrupt no new check starts.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from model_checks import children
from model_checks.mutation.operators import Mutant

KILLED, SURVIVED, TIMEOUT = "killed", "survived", "timeout"
MAX_JOBS = 64
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".mypy_cache")


@dataclass(frozen=True)
class Check:
    """One way to judge a mutant: ``argv`` run in the mutant's copy; exit 0 = survived."""

    name: str  # the column in the report ("fuzz", "unit")
    argv: tuple[str, ...]
    timeout_s: float = 300.0
    counts: bool = True  # whether a kill by this check kills the mutant in the summary

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"check {self.name!r} has an empty argv")
        if not (self.timeout_s > 0):
            raise ValueError(f"check {self.name!r}: timeout_s must be > 0")


@dataclass
class MutantResult:
    mutant: Mutant
    outcomes: dict[str, str] = field(default_factory=dict)  # check name -> KILLED/...
    details: dict[str, str] = field(default_factory=dict)  # check name -> last output line
    seconds: float = 0.0

    def status(self, checks: Sequence[Check] | None = None) -> str:
        """killed if a counting check killed it, else timeout if one timed out, else
        survived (``checks``: the ones that count; default every recorded one)."""
        names = [c.name for c in checks if c.counts] if checks is not None else self.outcomes
        got = [self.outcomes[n] for n in names if n in self.outcomes]
        if KILLED in got:
            return KILLED
        return TIMEOUT if TIMEOUT in got else SURVIVED


def _run_check(check: Check, cwd: Path) -> tuple[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = children.popen(
        check.argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        out, _ = proc.communicate(timeout=check.timeout_s)
    except subprocess.TimeoutExpired:
        children.end_group(proc)
        proc.communicate()
        return TIMEOUT, f"ran past {check.timeout_s:g} s"
    finally:
        children.release(proc)
    if children.stopping():  # ended by an interrupt: no verdict
        raise KeyboardInterrupt
    tail = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
    last = tail[-1][:300] if tail else ""
    return (SURVIVED if proc.returncode == 0 else KILLED), last


def run_mutants(
    root: Path,
    mutants: Sequence[Mutant],
    checks: Sequence[Check],
    *,
    copy: Sequence[str],
    jobs: int = 1,
    stop_at_first_kill: bool = False,
    on_result: Callable[[MutantResult], None] | None = None,
) -> list[MutantResult]:
    """Run every check on every mutant (``jobs`` at a time), in the order given.

    ``copy``: the folders and files of ``root`` each worker's copy needs.
    ``stop_at_first_kill``: skip a mutant's later checks once a counting one killed it
    (their columns are then absent). ``on_result`` is called as each mutant finishes."""
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"jobs must be between 1 and {MAX_JOBS}, got {jobs}")
    for m in mutants:
        if m.file.split("/")[0] not in {c.split("/")[0] for c in copy}:
            raise ValueError(f"mutant {m.id} is in {m.file}, outside the copied {list(copy)}")
    if children.stopping():
        raise KeyboardInterrupt
    with children.temp_dir("kvown-mutate-") as tmp:
        slots: queue.Queue[Path] = queue.Queue()
        for k in range(min(jobs, max(1, len(mutants)))):
            d = Path(tmp) / f"w{k}"
            d.mkdir()
            for name in copy:
                src = root / name
                if src.is_dir():
                    shutil.copytree(src, d / name, ignore=_IGNORE)
                else:
                    (d / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, d / name)
            slots.put(d)

        def one(m: Mutant) -> MutantResult:
            d = slots.get()
            target = d / m.file
            original = target.read_bytes()
            res = MutantResult(m)
            t0 = time.perf_counter()
            try:
                target.write_text(m.source, encoding="utf-8")
                for c in checks:
                    res.outcomes[c.name], res.details[c.name] = _run_check(c, d)
                    if stop_at_first_kill and c.counts and res.outcomes[c.name] == KILLED:
                        break
            finally:
                target.write_bytes(original)
                slots.put(d)
            res.seconds = time.perf_counter() - t0
            if on_result is not None:
                on_result(res)
            return res

        pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            return list(pool.map(one, mutants))
        finally:  # an interrupt: the queued mutants never start, the running ones end
            pool.shutdown(wait=True, cancel_futures=True)


def summarise(
    results: Sequence[MutantResult],
    equivalents: dict[str, str],
    checks: Sequence[Check] | None = None,
) -> dict[str, object]:
    """The report: ``{"mutants", "killed", "equivalent", "timed_out", "survivors": [...],
    "kill_rate", "by_check"}``. Equivalents (by id) are counted apart and excluded from
    the rate; a timeout counts as neither killed nor survived."""
    killed = equivalent = timed_out = 0
    survivors: list[dict[str, object]] = []
    by_check: dict[str, dict[str, int]] = {}
    for r in results:
        for name, outcome in r.outcomes.items():
            col = by_check.setdefault(name, {KILLED: 0, SURVIVED: 0, TIMEOUT: 0})
            col[outcome] += 1
        if r.mutant.id in equivalents:
            equivalent += 1
            continue
        st = r.status(checks)
        if st == KILLED:
            killed += 1
        elif st == TIMEOUT:
            timed_out += 1
        else:
            survivors.append(r.mutant.to_json())
    judged = killed + len(survivors)
    return {
        "mutants": len(results),
        "killed": killed,
        "equivalent": equivalent,
        "timed_out": timed_out,
        "survivors": survivors,
        "kill_rate": round(killed / judged, 4) if judged else None,
        "by_check": by_check,
    }
