"""What crosses into the cluster's processes from outside them, read by the one strict
reader (issue #34, What to build 1): a worker's arguments (``WorkerArgs.from_json``, the
router's JSON on its command line) and the per-process event logs the run merges and
checks (``eventlog.read_events``, ``last_clock``), and the conformance checker's read-ahead
of a declared world's sizes (``sizing``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_checks.conformance.sizing import declares_world, prescan
from refimpl.cluster import eventlog
from refimpl.cluster.worker import WorkerArgs, main
from spec.strict_json import StrictJSONError

ARGS = WorkerArgs(
    role="decode", rank=0, prefill_tp=2, decode_tp=1, store_host="127.0.0.1", store_port=1,
    backend="gloo", log_dir="/nonexistent", t0=0.0, timeout_s=3.0, model={}, capacity=8,
    ready_wait_s=1.0,
)  # fmt: skip


def test_worker_arguments_round_trip() -> None:
    assert WorkerArgs.from_json(ARGS.to_json()) == ARGS


def _with(**kw: object) -> str:
    return json.dumps({**json.loads(ARGS.to_json()), **kw})


BAD_ARGS = [
    ("unknown field", _with(evil=1), "unknown field 'evil'"),
    ("missing field", json.dumps({"role": "decode"}), "missing field 'rank'"),
    ("deep", '{"model":' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper"),
    ("duplicate key", '{"rank":0,"rank":1}', "duplicate key"),
    ("not an object", "[1]", "not a JSON object"),
    ("huge", '{"a":"' + "x" * (2 << 20) + '"}', "longer than the cap"),
    ("empty", "", "bad JSON"),
]


@pytest.mark.parametrize(("name", "text", "why"), BAD_ARGS, ids=[c[0] for c in BAD_ARGS])
def test_bad_worker_arguments_are_one_named_error(name: str, text: str, why: str) -> None:
    with pytest.raises(StrictJSONError, match="worker arguments") as exc:
        WorkerArgs.from_json(text)
    assert why in str(exc.value)


def test_a_worker_given_bad_arguments_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["worker", _with(evil=1)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvown worker: worker arguments: unknown field") and err.count("\n") == 1


def _event(lc: object, seq: object = 1, proc: object = "p0", action: object = "Ready") -> str:
    return json.dumps({"action": action, "args": {}, "lc": lc, "proc": proc, "seq": seq})


def test_a_hostile_line_in_a_process_log_is_skipped_and_the_rest_merge(tmp_path: Path) -> None:
    """Lines a killed or tampered-with process may leave: torn, deep, too long, duplicate
    keys, NaN, and records whose sort fields have the wrong type (``merge`` raised
    TypeError on ``"lc": "9"`` beside an int). Only the sound records are kept."""
    log = tmp_path / "p0.jsonl"
    lines = [
        _event(1),
        '{"action":"Ready","lc":2,"proc":"p0","seq":2,"lc":3}',  # duplicate key
        "[" * 100_000,
        '{"action":"Ready","args":{},"lc":NaN,"proc":"p0","seq":3}',
        '{"a":"' + '\\"' * 100_000 + '"}',  # an escaped-quote run past the line cap
        _event("9", seq=4),
        _event(True, seq=5),
        _event(6, seq=None),
        _event(7, proc=["p0"]),
        _event(8, action=1),
        _event(10, seq=6),
        '{"action":"Ready","lc":11,"pro',  # torn
    ]
    log.write_text("\n".join(lines))
    merged = eventlog.merge(eventlog.read_events([log, tmp_path / "absent.jsonl"]))
    assert [(e["lc"], e["seq"]) for e in merged] == [(1, 1), (10, 6)]
    assert eventlog.last_clock(log) == 10
    assert eventlog.last_clock(tmp_path / "absent.jsonl") == 0


def test_the_read_ahead_of_sizes_takes_only_strict_lines() -> None:
    """A header with a key twice is not strict JSON: it declares no world (the check
    itself refuses it), and a duplicate-keyed line adds no size."""
    assert declares_world('{"sizes": {"blocks": 2}}')
    assert not declares_world('{"sizes": {"blocks": 2}, "sizes": {"blocks": 2}}')
    stage = '{"action":"PrefillStage","args":{"req":0,"blocks":[0,1,2,3,4,5,6]}}'
    dup = '{"action":"PrefillStage","action":"PrefillStage","args":{"req":0,"blocks":[0,1,2]}}'
    assert prescan([(1, stage)]) == prescan([(1, stage), (2, dup)])
