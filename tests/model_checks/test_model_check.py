"""The explicit-state check: pinned outcomes, mutants caught, traces replayable,
symmetry sound, the CLI's contract."""

from __future__ import annotations

import json

import pytest

from kvown_cli.main import main
from model_checks.explicit import pin
from model_checks.explicit.explore import explore
from model_checks.explicit.runner import check_config, check_mutant
from model_checks.explicit.trace import pretty, replay, same_state
from spec.actions import decode_args
from spec.config import CONFIGS, DEEP_SUITE, DEFAULT_SUITE, get_config
from spec.invariants import INVARIANTS, broken_invariants
from spec.mutants import MUTANTS
from spec.properties import PROPERTIES, violated_safety
from spec.steps import check_step

PINNED = pin.load()


@pytest.mark.parametrize("name", DEFAULT_SUITE)
def test_config_outcome_is_pinned(name: str) -> None:
    assert pin.measure_config(name) == PINNED["configs"][name]


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_caught_with_pinned_trace(name: str) -> None:
    r = check_mutant(name)
    assert r.caught, f"{name} not caught: broke {r.violated}"
    assert pin.measure_mutant(name) == PINNED["mutants"][name]
    assert r.trace is not None
    c = get_config(r.config)
    worlds = replay(c, frozenset({name}), r.trace.steps)  # the cex replays on the spec
    if r.expected in INVARIANTS:  # an INVARIANTS.md conjunct: the last state breaks it
        assert r.expected in broken_invariants(worlds[-1], c)
        assert r.expected not in broken_invariants(worlds[-2], c)
    elif PROPERTIES[r.expected].kind == "safety":
        # the last state breaks it, or the last step does (its transition predicate)
        last = r.trace.steps[-1]
        i, arg = decode_args(last["action"], last.get("args", {}))
        by_step = check_step(worlds[-2], last["action"], i, arg, worlds[-1], c)
        assert r.expected in violated_safety(worlds[-1], c) or r.expected in by_step
        assert r.expected not in violated_safety(worlds[-2], c)
    assert "=> violates" in pretty(c, frozenset({name}), r.trace.steps, r.expected)


def test_every_pinned_name_exists() -> None:
    assert set(PINNED["configs"]) == set(DEFAULT_SUITE)
    assert set(PINNED["mutants"]) == set(MUTANTS)
    assert set(PINNED.get("deep", {})) <= set(DEEP_SUITE)  # measured by `pin --deep`


def test_symmetry_reduction_is_sound_and_reduces() -> None:
    c = CONFIGS["handoff_two"]
    full = explore(c, symmetry=False)
    red = explore(c, symmetry=True)
    assert red.n_states < full.n_states
    assert full.first_violation == red.first_violation == {}
    # every unreduced state's canonical form is a reduced state
    reduced = set(red.states)
    from spec.state import canonical

    assert {canonical(w) for w in full.states} == reduced


def test_unreduced_run_finds_the_same_mutant_depth() -> None:
    name = "evict_referenced_prefix"
    c = CONFIGS["prefix_share"]
    a = explore(c, frozenset({name}), symmetry=False, stop_on="CapacityRefcount")
    b = explore(c, frozenset({name}), symmetry=True, stop_on="CapacityRefcount")
    assert (
        a.depth[a.first_violation["CapacityRefcount"]]
        == b.depth[b.first_violation["CapacityRefcount"]]
    )


def test_trace_concretization_tracks_request_ids() -> None:
    # zero_block_never_done's counterexample touches request slots that canonical
    # sorting renames; its concrete trace must replay step by step.
    r = check_mutant("zero_block_never_done")
    assert r.trace is not None
    c = get_config(r.config)
    worlds = replay(c, frozenset({r.name}), r.trace.steps)
    g = explore(c, frozenset({r.name}))
    assert any(same_state(worlds[-1], w) for w in g.states)


def test_check_config_reports_no_violation_on_correct_spec() -> None:
    r = check_config("offload_contend")
    assert r.violations == {}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_check_one_config_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "check", "--config", "offload_contend", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["configs"][0]["name"] == "offload_contend"
    assert (
        data["configs"][0]["distinct_states"]
        == PINNED["configs"]["offload_contend"]["distinct_states"]
    )
    assert {p["id"] for p in data["properties"]} == set(PROPERTIES)
    assert all(p["holds"] for p in data["properties"])
    assert "violated" not in data


def test_cli_mutant_json_has_a_replayable_trace(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "check", "--mutant", "failed_store_visible", "--json")
    assert rc == 1
    data = json.loads(out)
    assert data["violated"] == "PublishAfterCommit"
    c = get_config(data["config"])
    worlds = replay(c, frozenset({"failed_store_visible"}), data["trace"])
    assert "PublishAfterCommit" in violated_safety(worlds[-1], c)
    assert len(data["trace"]) == PINNED["mutants"]["failed_store_visible"]["trace_length"]


@pytest.mark.parametrize(
    "argv",
    [
        ("check", "--config", "nope"),
        ("check", "--mutant", "nope"),
        ("check", "--frobnicate"),
        ("nope",),
        (),
        ("check", "--dot", "x.dot"),
    ],
)
def test_cli_misuse_exits_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    rc, _, err = _run(capsys, *argv)
    assert rc == 2
    if argv[:2] == ("check", "--config"):
        assert "valid configs: handoff_tp2to1" in err
    if argv[:2] == ("check", "--mutant"):
        assert "valid mutants: release_before_install" in err


def test_cli_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "list", "--json")
    assert rc == 0
    data = json.loads(out)
    assert {m["name"] for m in data["mutants"]} == set(MUTANTS)
    assert {p["id"] for p in data["properties"]} == set(PROPERTIES)
    assert len(data["actions"]) >= 39


def test_cli_dot_of_a_small_config(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "g.dot"
    rc, _, _ = _run(capsys, "check", "--config", "offload_contend", "--dot", str(f))
    assert rc == 0
    text = f.read_text()
    assert text.startswith("digraph kvown")
    assert text.count("->") == PINNED["configs"]["offload_contend"]["edges"]
