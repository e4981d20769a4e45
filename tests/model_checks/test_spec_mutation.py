"""``kvown mutate --target spec``: the generated mutants, the dead-branch filter, the
reachable-step shortcut, one mutant judged end to end through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvown_cli.main import main
from model_checks.mutation.spec_prefilter import Reachable, changes_a_step
from model_checks.mutation.spec_target import FILES, ROOT, dead_lines, mutants

# killed on handoff_crash, the second config the check runs (seconds)
QUICK_KILL = "spec.actions_decode.DecodeReserve:negate_compare:397b9c78"


@pytest.fixture(scope="module")
def pool() -> dict[str, object]:
    return {m.id: m for m in mutants()}


def test_enough_mutants_from_every_action_file(pool: dict[str, object]) -> None:
    assert len(pool) >= 100
    files = {m.file for m in pool.values()}  # type: ignore[attr-defined]
    assert files == set(FILES)


def test_known_mutant_branches_are_left_out(pool: dict[str, object]) -> None:
    src = (ROOT / "spec/actions_prefill.py").read_text()
    dead = dead_lines(src)
    line = next(k for k, x in enumerate(src.splitlines(), 1) if "G_FROZEN_WRITE))" in x)
    assert line in dead  # the body of `if "source_writes_while_frozen" in m:`
    assert not any(m.file == "spec/actions_prefill.py" and m.line == line for m in pool.values())  # type: ignore[attr-defined]


def test_dead_lines_of_both_switch_forms() -> None:
    src = (
        "def f(m, x):\n"
        '    if "a" in m:\n'
        "        x = 1\n"
        '    if "b" not in m:\n'
        "        x = 2\n"
        "    else:\n"
        "        x = 3\n"
        "    return x\n"
    )
    assert dead_lines(src) == {3, 7}


def test_shortcut_tells_changed_from_unchanged(pool: dict[str, object]) -> None:
    """offload_contend has no handoff: no DecodeReserve step is reachable there, so a
    mutant of it changes nothing; a mutant of the offload copy bound changes a step."""
    reach = Reachable(["offload_contend"])
    reserve = next(i for i in pool if i.startswith("spec.actions_decode.DecodeReserve:"))
    assert changes_a_step(pool[reserve], reach) is False  # type: ignore[arg-type]
    copy = next(
        i
        for i, m in pool.items()
        if i.startswith("spec.actions_prefill.PrefillOffloadCopy:flip_boundary")
    )
    assert changes_a_step(pool[copy], reach) is True  # type: ignore[arg-type]
    helper = next(i for i, m in pool.items() if m.file == "spec/common.py")  # type: ignore[attr-defined]
    assert changes_a_step(pool[helper], reach) is None  # type: ignore[arg-type]


def test_cli_judges_one_mutant(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's exit code and report, and the judge's verdict: a property (or conjunct)
    broken on a config of the suite, never a crash of the judge itself. One judged
    mutant for both (each judgment is a copy of the repository and a model check in its
    own process; they were two tests, two judgments)."""
    from model_checks.mutation import spec_target
    from spec.config import SUITES
    from spec.invariants import INVARIANTS
    from spec.properties import PROPERTIES

    judged: list[object] = []
    real = spec_target.run

    def spy(*args: object, **kw: object) -> object:
        report, results = real(*args, **kw)  # type: ignore[arg-type]
        judged.extend(results)
        return report, results

    monkeypatch.setattr(spec_target, "run", spy)
    rc = main(
        [
            "mutate",
            "--target",
            "spec",
            "--only",
            QUICK_KILL,
            "--no-prefilter",
            "--jobs",
            "1",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert (out["mutants"], out["killed"], out["survivors"]) == (1, 1, [])
    assert {"mutants", "killed", "equivalent", "survivors"} <= set(out)
    (res,) = judged
    detail = next(iter(res.details.values()))  # type: ignore[attr-defined]
    words = detail.removeprefix("killed: ").split(" on ")
    assert detail.startswith("killed: ") and words[1] in SUITES["default"], detail
    assert set(words[0].split(",")) <= set(PROPERTIES) | set(INVARIANTS), detail


def test_cli_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutate", "--target", "spec", "--only", "no.such:mutant:0", "--no-prefilter"]) == 2
    assert "unknown spec mutant ids: no.such:mutant:0" in capsys.readouterr().err
    assert main(["mutate", "--target", "spec", "--sample", "0"]) == 2


def test_configs_run_in_increasing_size() -> None:
    from model_checks.mutation.spec_check import order, pinned_states
    from spec.config import SUITES

    got = order(["default"])
    assert sorted(got) == sorted(SUITES["default"])
    sizes = [pinned_states(n) for n in got]
    assert None not in sizes and sizes == sorted(sizes)  # type: ignore[type-var]


def test_mutants_on_lines_no_config_executes_are_not_run(pool: dict[str, object]) -> None:
    """offload_contend has no handoff: DecodeReserve's lines never run there, the offload
    copy's do; module-level lines (constants) always count as run (import)."""
    from model_checks.mutation.spec_coverage import measure, uncovered

    hit = measure(ROOT, FILES, ["offload_contend"])
    ms = list(pool.values())
    skip = uncovered(ROOT, ms, hit)  # type: ignore[arg-type]
    reserve = {i for i in pool if i.startswith("spec.actions_decode.DecodeReserve:")}
    copy = {i for i in pool if i.startswith("spec.actions_prefill.PrefillOffloadCopy:")}
    assert reserve and reserve <= skip
    assert copy and not copy & skip
    assert 0 < len(skip) < len(ms)


@pytest.mark.parametrize(
    "planted",
    [b"[" * 100_000, b'{"f": ' + b"9" * 5000 + b"}", b'{"f": NaN}', b"[1]"]
    + [b'{"f": [true]}', b"\xff"],
    ids=["deep", "huge int", "NaN", "a list", "bools", "not UTF-8"],
)
def test_a_planted_coverage_cache_is_a_miss_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: bytes
) -> None:
    """The cache lies in the shared temporary folder: whatever another program left at its
    name is read by the strict reader and, if it is not what ``covered_lines`` writes,
    the lines are measured again (a deep file raised RecursionError out of kvown mutate)."""
    from model_checks.mutation import spec_coverage as sc

    monkeypatch.setattr(sc.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(sc, "measure", lambda root, files, configs: {"f": {3}})
    cache = tmp_path / f"kvown-spec-coverage-{sc._key(ROOT, ['f'], ['c'])}.json"
    cache.write_bytes(planted)
    assert sc.covered_lines(ROOT, ["f"], ["c"]) == ({"f": {3}}, False)
    assert sc.covered_lines(ROOT, ["f"], ["c"]) == ({"f": {3}}, True)  # rewritten whole
