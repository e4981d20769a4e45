"""`kvown check --workers N`: the parallel explorer (model_checks/explicit/parallel.py)
builds the very graph the serial explorer builds: the same state ids, edges, parents,
depths and shallowest violations, so the same state counts, verdicts and counterexamples.
Small pinned configs only (the suite's time); handoff_tp2to1 is measured in
benchmarks/RESULTS.md."""

from __future__ import annotations

import json

import pytest

from kvown_cli.main import main
from model_checks.explicit.explore import Graph, explore
from model_checks.explicit.parallel import explore_parallel
from model_checks.explicit.partition import label_code, label_of, owner
from model_checks.explicit.pin import load
from model_checks.explicit.runner import check_config, check_mutant
from spec.config import get_config

FIELDS = (
    "states",
    "depth",
    "parent",
    "parent_label",
    "src",
    "dst",
    "lab",
    "first_edge",
    "first_violation",
    "first_step_violation",
    "first_edge_violation",
)


def _same(a: Graph, b: Graph) -> None:
    for f in FIELDS:
        assert getattr(a, f) == getattr(b, f), f


@pytest.mark.parametrize(("name", "workers"), [("handoff_crash", 2), ("offload_contend", 3)])
def test_same_graph_as_serial(name: str, workers: int) -> None:
    c = get_config(name)
    serial, par = explore(c), explore_parallel(c, workers=workers)
    _same(serial, par)
    assert par.n_states == load()["configs"][name]["distinct_states"]


def test_same_verdicts_and_counts_as_pinned() -> None:
    r = check_config("crash_both", workers=2)
    pinned = load()["configs"]["crash_both"]
    assert (r.graph.n_states, r.graph.n_edges, r.graph.max_depth) == (
        pinned["distinct_states"],
        pinned["edges"],
        pinned["depth"],
    )
    assert not r.violations and pinned["result"] == "holds"
    assert r.cpu_seconds > 0  # the workers' CPU time is counted


@pytest.mark.parametrize(
    "mutant",
    [
        "release_before_install",  # a safety mutant: stop at the first violation
        "sweep_only_on_admit",  # a liveness mutant: the whole graph, then liveness
    ],
)
def test_mutant_same_counterexample(mutant: str) -> None:
    serial, par = check_mutant(mutant), check_mutant(mutant, 2)
    assert par.caught and par.trace is not None and serial.trace is not None
    assert par.trace.steps == serial.trace.steps
    assert par.violated == serial.violated
    assert par.trace_length == load()["mutants"][mutant]["trace_length"]


def test_stop_keeps_the_serial_extent() -> None:
    """Stopping at a violation: the workers finish the level, the replay stops where the
    serial explorer stops (the same states, edges and recorded violations)."""
    c = get_config("handoff_tp2to1")
    m = frozenset({"release_before_install"})
    _same(explore(c, m, stop_on="NothingLost"), explore_parallel(c, m, stop_on="NothingLost"))


def test_edge_props_and_spawn() -> None:
    """Transition properties given by the caller, on processes started with spawn (the
    platforms without fork): the first violating edge is the serial one."""
    c = get_config("crash_both")
    props = [("NoCrashOfDecode", _no_decode_crash)]
    a = explore(c, edge_props=props)
    b = explore_parallel(c, edge_props=props, method="spawn")
    _same(a, b)
    assert "NoCrashOfDecode" in b.first_edge_violation


def _no_decode_crash(pre: object, name: str, i: int, arg: int, post: object, c: object) -> bool:
    return not (name == "EnvCrash" and arg == 1)


def test_labels_and_owner() -> None:
    for lb in [("PrefillAdmit", 0, 0), ("DecodeReserve", 3, 0x1234567), ("EnvCrash", 0, 1)]:
        assert label_of(label_code(lb)) == lb
    w = get_config("handoff_two").initial()
    assert owner(w, 2) == hash(w) % 2 and 0 <= owner(w, 3) < 3


def test_cli_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", "offload_contend", "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["check", "--config", "offload_contend", "--workers", "2", "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["configs"][0]
    assert cfg["distinct_states"] == load()["configs"]["offload_contend"]["distinct_states"]
