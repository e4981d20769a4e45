"""Hypothesis settings profiles (``refimpl/testing/run.py``): ``ci`` (derandomised, bounded)
by default, so the README's test command gives the same result on every machine;
``HYPOTHESIS_PROFILE`` picks ``dev`` or ``nightly`` (randomised, more examples) instead.

The ``nightly`` marker: a long run left to ``.ci/nightly`` (``KVOWN_NIGHTLY=1``). The
worker count of ``-n auto`` (pyproject's addopts): ``auto_workers``. ``KVOWN_CPU_LOG=PATH``
writes each test's CPU seconds (its process and the children it waited for, setup to
teardown), its wall seconds and its end time to ``PATH.<worker>`` as JSON lines: the
figures of benchmarks/RESULTS.md's suite section, read by CPU rather than by wall clock
on a shared machine (the end times: when each worker finished)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import settings

from refimpl.testing.run import register_profiles

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


# Examples per Hypothesis machine in the suite (the derandomised ci profile): the graph tour
# (tests/fuzz/test_tour.py, test_tour_kills.py) holds the coverage and the kill matrix
# deterministically, the random walk adds data and interleavings; the nightly job
# (KVOWN_NIGHTLY=1) runs the loaded profile's full count.
SUITE_EXAMPLES = 10


def suite_examples() -> int | None:
    """``max_examples`` for a suite machine: SUITE_EXAMPLES (``KVOWN_SUITE_EXAMPLES``, for
    a side-by-side mutation run) under the derandomised (ci) profile, None (the profile's
    own) under a random profile or in the nightly job."""
    if settings.default.derandomize and os.environ.get("KVOWN_NIGHTLY") != "1":
        given = os.environ.get("KVOWN_SUITE_EXAMPLES", "")  # a side-by-side run's count
        n = int(given) if given.strip().isdigit() and int(given) > 0 else SUITE_EXAMPLES
        return min(n, settings.default.max_examples)
    return None


MAX_WORKERS = 2  # CI's cores; more workers on a bigger machine: PYTEST_XDIST_AUTO_NUM_WORKERS


def auto_workers(env: Mapping[str, str] = os.environ) -> int:
    """The suite's xdist workers for ``-n auto``: ``PYTEST_XDIST_AUTO_NUM_WORKERS`` when set,
    else min(MAX_WORKERS, the CPUs this process may run on); 0 (no workers: the tests run in
    pytest's own process) where that is 1, since one worker only adds its start-up."""
    given = env.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if given.strip().isdigit():
        return int(given)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    n = min(MAX_WORKERS, cpus)
    return n if n > 1 else 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return auto_workers()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nightly: a long run (minutes of CPU) left to the nightly job; runs when KVOWN_NIGHTLY=1",
    )
    config.addinivalue_line(
        "markers",
        "by_encoding(config=None): runs in the xdist group of its config's z3 encoding"
        " (group_by_encoding)",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group_by_mutant(items)
    group_by_encoding(items)
    if os.environ.get("KVOWN_NIGHTLY") == "1":
        return
    skip = pytest.mark.skip(reason="nightly: KVOWN_NIGHTLY=1 runs it")
    for item in items:
        if item.get_closest_marker("nightly") is not None:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)  # before an xdist worker sends its collected ids
def pytest_collection_finish(session: pytest.Session) -> None:
    name_groups(session.config, session.items)


def name_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` sends the tests of one group to one worker by a suffix of their
    ids (``id@group``) that xdist's worker writes to ``item._nodeid``; since pytest 9.2 a
    node's id is ``item._id`` (a NodeId) and that write is lost, so every group was split
    over the workers (28 of 46 mutants' tests in one run at 504ee4b) and each worker
    explored the mutant again. Where the suffix is missing, it is written here the same
    way (xdist's format: the group names sorted, joined by ``_``)."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        if not names or "@" in item.nodeid or not hasattr(item, "_id"):
            continue
        from _pytest.nodeid import NodeId  # pytest >= 9.2, where ids are NodeIds

        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(names))}")


def group_by_mutant(items: list[pytest.Item]) -> None:
    """Every test of a spec mutant runs on the worker of that mutant's ``xdist_group``:
    ``check_mutant`` (the model check of the mutant, cached per process) is then explored
    once for all of them (tests/model_checks/test_model_check.py,
    tests/fuzz/test_trace_replay_all.py, tests/refimpl/test_engine_mutants.py and the
    behaviour tests share it), not once per worker that draws one of its tests. A test is
    of a mutant when one of its parameters is the mutant's name, or when its function
    calls ``check_mutant`` with a mutant's name written in it (a literal, or a module
    constant: ``mutant_named``)."""
    from spec.mutants import MUTANTS

    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        named = [v for v in params.values() if isinstance(v, str) and v in MUTANTS]
        if not named:
            named = mutant_named(getattr(item, "function", None))
        if named and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(f"mutant:{named[0]}"))


def mutant_named(fn: object) -> list[str]:
    """The mutants whose name a test function that calls ``check_mutant`` writes: a string
    constant of its code, or a global of its module it reads, that is a mutant's name."""
    from spec.mutants import MUTANTS

    code = getattr(fn, "__code__", None)
    if code is None or "check_mutant" not in code.co_names:
        return []
    glob = getattr(fn, "__globals__", {})
    found = [c for c in code.co_consts if isinstance(c, str)]
    found += [glob[n] for n in code.co_names if isinstance(glob.get(n), str)]
    return [v for v in found if v in MUTANTS]


def group_by_encoding(items: list[pytest.Item]) -> None:
    """A test marked ``by_encoding`` runs in the ``xdist_group`` of its config's z3
    encoding (``encoding:<config>``), so the ``shared_encoding`` of that config (2-3 CPU s
    to trace each) is built once in the suite for all the tests that read it, not once
    per worker that draws one. The config is the test's ``name`` or ``config`` parameter
    when that is a config's name, else the mark's argument. A test already in a group
    (a mutant's) stays there."""
    from spec.config import CONFIGS

    for item in items:
        mark = item.get_closest_marker("by_encoding")
        if mark is None or item.get_closest_marker("xdist_group") is not None:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        named = [params[k] for k in ("name", "config") if params.get(k) in CONFIGS]
        config = named[0] if named else (mark.args[0] if mark.args else None)
        if config not in CONFIGS:
            where = getattr(item, "nodeid", "a test")
            raise pytest.UsageError(f"{where}: by_encoding names no config ({config!r})")
        item.add_marker(pytest.mark.xdist_group(f"encoding:{config}"))


def _cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get("KVOWN_CPU_LOG")
    if not path:
        yield
        return
    c0, w0 = _cpu_now(), time.time()
    yield
    cpu, end = _cpu_now() - c0, time.time()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    rec = {"id": item.nodeid, "cpu": round(cpu, 3), "wall": round(end - w0, 3), "end": end}
    with open(f"{path}.{worker}", "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
