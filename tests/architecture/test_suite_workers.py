"""The suite runs on both cores: the README's ``python -m pytest`` takes pyproject's addopts
(``-n auto --dist loadgroup``), ``-n auto`` is ``tests/conftest.py``'s ``auto_workers``
(min(2, the CPUs), none on one CPU), and the extra that the README installs brings
pytest-xdist, without which ``-n`` is an unknown option. A test parametrized by a spec
mutant joins that mutant's ``xdist_group`` (``group_by_mutant``)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from spec.mutants import MUTANTS
from tests.conftest import MAX_WORKERS, auto_workers, group_by_encoding, group_by_mutant

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def test_auto_is_two_workers_at_most_and_none_on_one_cpu() -> None:
    n = auto_workers({})
    assert n == (min(MAX_WORKERS, _cpus()) if _cpus() > 1 else 0)
    assert MAX_WORKERS == 2 and n != 1  # one worker is the serial run plus a start-up


def test_the_environment_variable_sets_the_count() -> None:
    assert auto_workers({"PYTEST_XDIST_AUTO_NUM_WORKERS": "5"}) == 5
    assert auto_workers({"PYTEST_XDIST_AUTO_NUM_WORKERS": "0"}) == 0
    assert auto_workers({"PYTEST_XDIST_AUTO_NUM_WORKERS": "many"}) == auto_workers({})


def test_addopts_run_the_suite_on_auto_workers_by_group() -> None:
    opts = PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert opts[opts.index("-n") + 1] == "auto"
    assert opts[opts.index("--dist") + 1] == "loadgroup"


def test_the_extras_that_run_the_suite_bring_xdist() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    for name in ("dev", "test"):
        assert any(r.startswith("pytest-xdist") for r in extras[name]), name


class _Item:
    """What ``group_by_mutant`` reads of a pytest item: its parameters and its marks."""

    def __init__(self, **params: object) -> None:
        self.callspec = type("CallSpec", (), {"params": params})()
        self.marks: list[pytest.MarkDecorator] = []

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark)

    def get_closest_marker(self, name: str) -> pytest.MarkDecorator | None:
        return next((m for m in self.marks if m.name == name), None)


def test_a_test_of_a_mutant_joins_that_mutants_group() -> None:
    name = next(iter(MUTANTS))
    items = [_Item(name=name), _Item(name="not a mutant"), _Item(tp=2)]
    group_by_mutant(items)  # type: ignore[arg-type]
    (mark,) = items[0].marks
    assert mark.name == "xdist_group" and mark.args == (f"mutant:{name}",)
    assert items[1].marks == [] and items[2].marks == []


MUTANT_CONST = "release_before_install"


def _calls_with_a_literal() -> object:
    from model_checks.explicit.runner import check_mutant

    return check_mutant("release_before_install")


def _calls_with_a_constant() -> object:
    from model_checks.explicit.runner import check_mutant

    return check_mutant(MUTANT_CONST)


def _names_without_checking() -> str:
    return "release_before_install"


def test_a_test_that_checks_a_named_mutant_joins_that_mutants_group() -> None:
    """``check_mutant("name")`` (or a module constant) in a test not parametrized by the
    mutant: the same group, so the mutant's model check is one per suite, not per worker."""
    fns = (_calls_with_a_literal, _calls_with_a_constant, _names_without_checking)
    items = [_Item(), _Item(), _Item()]
    for it, fn in zip(items, fns, strict=True):
        it.function = fn  # type: ignore[attr-defined]
    group_by_mutant(items)  # type: ignore[arg-type]
    assert [m.args for m in items[0].marks] == [("mutant:release_before_install",)]
    assert [m.args for m in items[1].marks] == [("mutant:release_before_install",)]
    assert items[2].marks == []


def test_a_test_of_a_configs_encoding_joins_that_encodings_group() -> None:
    """``by_encoding``: the config parameter's group, else the mark's argument; a test
    already in a (mutant's) group stays in it; a mark that names no config is an error."""
    items = [_Item(name="handoff_two"), _Item(), _Item(config="offload_crash"), _Item()]
    for it, arg in zip(items, ((), ("handoff_tp2to1",), ("handoff_two",), ()), strict=True):
        it.marks.append(pytest.mark.by_encoding(*arg))
    items[3].marks.append(pytest.mark.xdist_group("mutant:x"))
    group_by_encoding(items[:3])  # type: ignore[arg-type]
    group_by_encoding(items[3:])  # type: ignore[arg-type]
    groups = [[m.args for m in it.marks if m.name == "xdist_group"] for it in items]
    assert groups == [
        [("encoding:handoff_two",)],
        [("encoding:handoff_tp2to1",)],
        [("encoding:offload_crash",)],
        [("mutant:x",)],
    ]
    bad = _Item()
    bad.marks.append(pytest.mark.by_encoding("no_such_config"))
    with pytest.raises(pytest.UsageError, match="no_such_config"):
        group_by_encoding([bad])  # type: ignore[list-item]


@pytest.mark.xdist_group("tests/architecture/test_suite_workers.py::named")
def test_a_grouped_test_carries_its_group_in_its_id_on_a_worker(
    request: pytest.FixtureRequest,
) -> None:
    """loadgroup schedules by the id's ``@group`` suffix (``name_groups`` writes it where
    xdist's own write is lost, pytest >= 9.2): without it every group is split over the
    workers. Only a loadgroup worker has the suffix (the suite's ``-n auto``)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on a --dist loadgroup worker")
    assert request.node.nodeid.endswith("@tests/architecture/test_suite_workers.py::named")
