"""kvown check-trace: example logs, malformed input, assumed steps, a long log."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.trace_check_bench import generate
from kvown_cli import check_trace as cmd_check_trace
from model_checks.conformance import LogError, check_file, check_text, parse_log

TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"

# file: (line, property) of the first violation; None: the log conforms.
# The same table is in repro/traces/README.md.
EXPECTED: dict[str, tuple[int, str] | None] = {
    "ok_handoff.jsonl": None,
    "ok_cancel_mid_transfer.jsonl": None,
    "ok_offload_reload.jsonl": None,
    "ok_prefix_zero_block.jsonl": None,
    "ok_lost_message_timeout.jsonl": None,
    "ok_failed_write_after_fence.jsonl": None,
    "incident1_vllm_32255.jsonl": (9, "NoReuseUnderIO"),
    "incident2_sglang_30233.jsonl": (19, "NoPartialUse"),
    "incident3_trtllm_6507.jsonl": (17, "ManifestGate"),
    "incident4_vllm_46240.jsonl": (6, "LoadXorStore"),
    "incident5_lmcache_4991.jsonl": (6, "PublishAfterCommit"),
    "incident6_vllm_29870.jsonl": (5, "NoReuseUnderIO"),
    "incident7_sglang_31800.jsonl": (15, "BoundedExit"),
    # a bug log and its fixed twin per behaviour (issue #12 part B; repro/traces/README.md)
    "bug_quiesce_under_write.jsonl": (8, "NoReuseUnderIO"),
    "bug_release_without_ack.jsonl": (11, "NothingLost"),
    "bug_validate_after_abort.jsonl": (11, "NoPartialUse"),
    "bug_step_after_finish.jsonl": (15, "StickyEnd"),
    "bug_abort_committed.jsonl": (14, "NothingLost"),
    "bug_preempt_during_transfer.jsonl": (8, "NoReuseUnderIO"),
    "bug_load_before_store_ack.jsonl": (7, "LoadXorStore"),
    "bug_stall_silent.jsonl": (12, "BoundedExit"),
    "bug_stall_untimed.jsonl": (12, "NoDeadlock"),
    "bug_giveup_write_lands.jsonl": (10, "NoReuseUnderIO"),
    "bug_late_write_after_timeout.jsonl": (9, "NoReuseUnderIO"),
    "bug_evict_prefix_in_use.jsonl": (10, "CapacityRefcount"),
    "bug_free_with_step_in_flight.jsonl": (17, "NoReuseUnderIO"),
    # issue #21 items 2 and 3: writes that cannot be taken back, decode-side failure
    "bug_free_fenced_unrevocable.jsonl": (8, "NoReuseUnderIO"),
    "bug_batch_status_subset.jsonl": (10, "NoReuseUnderIO"),
    "bug_install_after_decode_failure.jsonl": (12, "StickyEnd"),
    "bug_step_after_decode_failure.jsonl": (12, "StickyEnd"),
    # issue #21 items 5 and 6: retraction and refetch, decode TP ranks
    "bug_retract_loses_kv.jsonl": (15, "NothingLost"),
    "bug_retract_keeps_epoch.jsonl": (19, "Fencing"),
    "bug_decode_runs_before_all_ranks.jsonl": (15, "RankAgreement"),
    # restarts (issue #21 item 4)
    "bug_restart_stale_ready.jsonl": (8, "Fencing"),
    "bug_restart_late_write.jsonl": (10, "NoReuseUnderIO"),
    # content identity and metadata slots (issue #21 items 7 and 8)
    "bug_prefix_hash_unchecked.jsonl": (9, "ContentIdentity"),
    "bug_unstaged_block_advertised.jsonl": (8, "ContentIdentity"),
    "bug_slot_reused_unfenced.jsonl": (17, "Fencing"),
    # the shared host cache: pins, publish after commit, a failed load (issue #22 items 1-3)
    "bug_evict_pinned_copy.jsonl": (4, "NoReuseUnderIO"),
    "bug_unpin_at_load_start.jsonl": (6, "NoReuseUnderIO"),
    "bug_reload_consumes_shared.jsonl": (8, "NoReuseUnderIO"),
    "bug_publish_before_commit.jsonl": (5, "PublishAfterCommit"),
    "bug_late_completion_publishes.jsonl": (7, "PublishAfterCommit"),
    "bug_failed_load_counted_loaded.jsonl": (7, "NoPartialUse"),
    "bug_failed_load_keeps_hit.jsonl": (6, "PublishAfterCommit"),
    # multi-turn append on decode (issue #22 item 5)
    "bug_append_after_evict.jsonl": (17, "NothingLost"),
    "bug_append_divergent_uncut.jsonl": (18, "ContentIdentity"),
    "bug_two_writers_on_session.jsonl": (13, "SingleWriter"),
    "bug_evict_pinned_session.jsonl": (17, "NothingLost"),
    # worlds declared by the log's header, sized from the log (issue #32 items 1-2, 5)
    "bug_async_free_reused_by_load.jsonl": (22, "NoReuseUnderIO"),
    "bug_restart_stale_host_replica.jsonl": (11, "PublishAfterCommit"),
    "bug_third_turn_after_evict.jsonl": (22, "NothingLost"),
    "bug_unstaged_without_prefix.jsonl": (9, "ContentIdentity"),
    "bug_cancel_during_append.jsonl": (19, "NothingLost"),
    # sliding-window pruning (issue #32 item 3, spec/window/__init__.py)
    "bug_window_prunes_under_store.jsonl": (6, "NoReuseUnderIO"),
}
# every bug log's fixed twin conforms: fixed_<x>.jsonl beside each bug_<x>.jsonl
EXPECTED.update({f"fixed_{n[4:]}": None for n in list(EXPECTED) if n.startswith("bug_")})


def cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    cmd_check_trace.add_arguments(p)
    return cmd_check_trace.run(p.parse_args(list(argv)))


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    rc = cli(*argv, "--json")
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def test_every_example_log_is_listed() -> None:
    assert sorted(p.name for p in TRACES.glob("*.jsonl")) == sorted(EXPECTED)
    readme = (TRACES / "README.md").read_text()
    for name, exp in EXPECTED.items():
        row = next(line for line in readme.splitlines() if f"`{name}`" in line)
        if exp is not None:
            assert f"| {exp[0]} |" in row and f"`{exp[1]}`" in row, row
        else:
            assert "conforms" in row, row


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_log_verdict(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exp = EXPECTED[name]
    rc, out, _ = cli_json(capsys, str(TRACES / name))
    assert set(out) >= {"conforms", "violated", "line", "event", "assumed_steps"}
    if exp is None:
        assert (rc, out["conforms"], out["violated"], out["line"]) == (0, True, None, None)
    else:
        assert rc == 1 and out["conforms"] is False
        assert (out["line"], out["violated"]) == exp
        lines = (TRACES / name).read_text().splitlines()
        assert out["event"] == json.loads(lines[exp[0] - 1])
        assert out["state"].startswith("r0: ")


def test_human_output_names_line_property_and_state(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(str(TRACES / "incident6_vllm_29870.jsonl")) == 1
    out = capsys.readouterr().out
    assert "line 5" in out and "NoReuseUnderIO" in out and "h=filling" in out


def test_assumed_steps_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli_json(capsys, str(TRACES / "ok_handoff.jsonl"))
    assert rc == 0
    got = [(s["before_line"], s["action"], s["args"].get("msg")) for s in out["assumed_steps"]]
    assert got[0] == (8, "PrefillRecvReady", "Ready")
    assert sorted(got[1:]) == sorted(
        [(14, "DecodeReceiveChunk", "Chunk")] * 4 + [(14, "DecodeReceiveDone", "RankDone")] * 2
    )
    # a manifest swap the log cannot show is assumed, and named
    v = check_file(TRACES / "incident3_trtllm_6507.jsonl")
    assert v.assumed[0]["action"] == "EnvManifestMismatch" and v.assumed[0]["before_line"] == 5


def test_max_gap_bounds_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli_json(capsys, str(TRACES / "ok_handoff.jsonl"), "--max-gap", "0")
    assert (rc, out["line"], out["violated"]) == (1, 8, "NoReuseUnderIO")  # sends before the Ready
    rc, out, _ = cli_json(capsys, str(TRACES / "ok_handoff.jsonl"), "--max-gap", "5")
    assert (rc, out["line"]) == (1, 14)  # 6 deliveries are missing before DecodeValidate


def test_logged_only_actions_are_never_assumed() -> None:
    # the offload copy of block 2 is an engine step: it is not filled in for the commit
    head = '{"config": "offload_contend"}\n'
    body = ["PrefillAdmit", "PrefillRun", "PrefillOffloadBegin", "PrefillOffloadCopy"]
    text = head + "".join(f'{{"action": "{a}", "args": {{"req": 0}}}}\n' for a in body)
    v = check_text(text + '{"action": "PrefillOffloadCommit", "args": {"req": 0}}\n')
    assert (v.line, v.violated) == (6, "PublishAfterCommit")
    v = check_text(text + '{"action": "PrefillOffloadCopy", "args": {"req": 0}}\n')
    assert v.conforms


def test_observed_mismatch_without_a_broken_property() -> None:
    text = '{"config": "handoff_two"}\n{"action": "PrefillAdmit", "args": {"req": 0}}\n'
    v = check_text(
        text + '{"action": "PrefillRun", "args": {"req": 0}, "observed": {"st": "finished"}}'
    )
    assert not v.conforms and v.line == 3 and v.violated == "Unmodelled"
    assert "observed st=finished" in v.reason and "st=running" in v.reason
    ok = check_text(
        text + '{"action": "PrefillRun", "args": {"req": 0}, "observed": {"st": "running"}}'
    )
    assert ok.conforms


def test_a_mutant_successor_is_judged_by_safety() -> None:
    data = (TRACES / "incident6_vllm_29870.jsonl").read_bytes()
    v = check_text(data, mutants=frozenset({"preempt_during_store"}))
    assert (v.line, v.violated) == (5, "NoReuseUnderIO")
    assert v.reason.startswith("the step breaks")


def test_config_from_option_overrides_and_is_required(tmp_path: Path) -> None:
    f = tmp_path / "noheader.jsonl"
    f.write_text('{"action": "PrefillAdmit", "args": {"req": 1}}\n')
    assert cli(str(f)) == 2
    assert cli(str(f), "--config", "handoff_two") == 0
    assert cli(str(f), "--config", "handoff_tp2to1") == 2  # one request only: req 1 is ill-typed
    first = tmp_path / "first.jsonl"
    first.write_text('{"config": "handoff_two", "action": "PrefillAdmit", "args": {"req": 1}}\n')
    assert check_file(first).conforms and check_file(first).events == 1


H = '{"config": "handoff_two"}'
A = '{"action": "PrefillAdmit", "args": {"req": 0}}'
MALFORMED = {
    "bad_json": ([H, A, '{"action": "PrefillRun", "args": {"req": 0}'], 3, "bad JSON"),
    "not_object": ([H, "[1, 2]"], 2, "JSON object"),
    "unknown_action": ([H, A, '{"action": "PrefillExplode", "args": {"req": 0}}'], 3, "unknown"),
    "no_action": ([H, '{"args": {"req": 0}}'], 2, "'action'"),
    "missing_arg": ([H, '{"action": "PrefillAdmit", "args": {}}'], 2, "'req'"),
    "wrong_type": ([H, '{"action": "PrefillAdmit", "args": {"req": "0"}}'], 2, "'req'"),
    "bool_req": ([H, '{"action": "PrefillAdmit", "args": {"req": true}}'], 2, "'req'"),
    "args_not_object": ([H, '{"action": "PrefillAdmit", "args": [0]}'], 2, "'args'"),
    "req_out_of_range": ([H, '{"action": "PrefillAdmit", "args": {"req": 2}}'], 2, "range"),
    "bad_msg_kind": (
        [
            H,
            A,
            '{"action": "DecodeReserve", "args": {"req": 0, "msg": "Ack", "epoch": 1, "idx": 0}}',
        ],
        3,
        "consumes",
    ),
    "missing_epoch": (
        [H, '{"action": "DecodeReserve", "args": {"req": 0, "msg": "Handoff", "idx": 0}}'],
        2,
        "'epoch'",
    ),
    "bad_worker": ([H, '{"action": "EnvCrash", "args": {"worker": "gpu"}}'], 2, "'worker'"),
    "unknown_config": (['{"config": "nope"}', A], 1, "unknown config"),
    "config_not_string": (['{"config": 3}', A], 1, "'config'"),
    "no_config": ([A], 1, "no config"),
    "empty": ([], 1, "empty log"),
    "header_only": ([H], 2, "empty log"),
    "bad_version": (['{"config": "handoff_two", "version": 2}', A], 1, "version"),
    "bad_timeout": (['{"config": "handoff_two", "timeout_s": -1}', A], 1, "timeout_s"),
    "t_missing": (['{"config": "handoff_two", "timeout_s": 5}', A], 2, "'t'"),
    "t_not_number": ([H, '{"action": "PrefillAdmit", "args": {"req": 0}, "t": "now"}'], 2, "'t'"),
    "observed_field": (
        [H, '{"action": "PrefillAdmit", "args": {"req": 0}, "observed": {"x": 1}}'],
        2,
        "observed",
    ),
    "observed_value": (
        [H, '{"action": "PrefillAdmit", "args": {"req": 0}, "observed": {"p": "gone"}}'],
        2,
        "observed",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_logs_exit_2_with_a_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, line, words = MALFORMED[case]
    f = tmp_path / f"{case}.jsonl"
    f.write_text("\n".join(lines) + ("\n" if lines else ""))
    rc, out, err = cli_json(capsys, str(f))
    assert rc == 2
    assert out["line"] == line and out["conforms"] is False and words in out["error"]
    assert f"{f}:{line}: " in err and "Traceback" not in err
    with pytest.raises(LogError) as exc:
        parse_log(f.read_bytes())
    assert exc.value.line == line


def test_blank_lines_count_and_bad_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "gaps.jsonl"
    f.write_bytes(b'{"config": "handoff_two"}\n\n\n{"action": "PrefillRun", "args": {"req": 0}}\n')
    rc, out, _ = cli_json(capsys, str(f))
    assert (rc, out["line"]) == (1, 4)  # not admitted yet: not allowed, on physical line 4
    f.write_bytes(b'{"config": "handoff_two"}\n{"action": "Prefill\xff"}\n')
    rc, out, _ = cli_json(capsys, str(f))
    assert (rc, out["line"]) == (2, 2)


def test_bad_options_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok = str(TRACES / "ok_handoff.jsonl")
    assert cli(ok, "--max-gap", "-1") == 2
    assert cli(ok, "--assume", "NoSuchAction") == 2
    assert cli(ok, "--config", "nope") == 2
    assert cli(str(tmp_path / "missing.jsonl")) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_assume_option_widens_the_search(tmp_path: Path) -> None:
    text = (TRACES / "ok_handoff.jsonl").read_text().splitlines()
    del text[8]  # drop one PrefillSendChunk (line 9): the log now lacks an engine step
    assert not check_text("\n".join(text)).conforms
    f = tmp_path / "dropped.jsonl"
    f.write_text("\n".join(text))
    assert cli(str(f), "--assume", "PrefillSendChunk", "--max-gap", "7") == 0


def test_generated_long_log_conforms_and_a_flipped_line_is_caught() -> None:
    text = generate(3000)
    v = check_text(text)
    assert v.conforms and v.events == 3000 and len(v.assumed) == 6
    lines = text.splitlines()
    k = lines.index('{"action": "DecodeStep", "args": {"req": 0}}')
    lines[k] = lines[k].replace('"DecodeStep"', '"DecodeFinish"')  # r0 ends early
    bad = check_text("\n".join(lines))
    assert (bad.conforms, bad.line, bad.violated) == (False, k + 3, "StickyEnd")  # its next step


def _log(config: str, *events: dict[str, Any]) -> str:
    return "\n".join([json.dumps({"config": config}), *(json.dumps(e) for e in events)])


def _s(action: str, **kw: Any) -> dict[str, Any]:
    return {"action": action, "args": {"req": 0}, **kw}


def _m(action: str, kind: str, epoch: int = 1, idx: int = 0) -> dict[str, Any]:
    return {"action": action, "args": {"req": 0, "msg": kind, "epoch": epoch, "idx": idx}}


def test_engine_mappings_from_eventlog_md() -> None:
    # vLLM producer frees at request_finished (delay-free off) before anyone installed
    v = check_text(
        _log(
            "handoff_tp2to1",
            _s("PrefillAdmit"),
            _s("PrefillRun"),
            _s("PrefillFreeze", observed={"p": "none"}),
        )
    )
    assert (v.line, v.violated) == (4, "NothingLost")
    # vLLM load error on one block, then a retry as a second attempt
    sends = [_s("PrefillSendChunk")] * 6
    landed = [
        _m("DecodeReceiveChunk", "Chunk" if k != 2 else "ChunkCorrupt", 1, k) for k in range(4)
    ]
    retry = [_m("PrefillResume", "Nack"), _s("PrefillFreeze"), _m("DecodeReserve", "Handoff", 2)]
    start = [
        _s("PrefillAdmit"),
        _s("PrefillRun"),
        _s("PrefillFreeze"),
        _m("DecodeReserve", "Handoff"),
    ]
    end = [
        _s("DecodeValidate"),
        _s("DecodeCommit"),
        _s("DecodeFinish"),
        _m("PrefillRelease", "Ack", 2),
    ]
    events = [
        *start,
        *sends,
        *landed,
        _s("DecodeAbort", observed={"d": "none"}),
        *retry,
        *sends,
        *end,
    ]
    v = check_text(_log("handoff_tp2to1", *events))
    assert v.conforms, v.reason
    assert [a["action"] for a in v.assumed].count("EnvCorrupt") == 1
    # without the logged deliveries, the invalid attempt is fenced and freed at once
    # (DecodeAbort of a running request), so the retry can reserve without a timeout
    events = [*start, *sends, landed[2], _s("DecodeAbort", observed={"d": "none"}), *retry]
    v = check_text(_log("handoff_tp2to1", *events))
    assert v.conforms, v.reason
    # an engine that quarantines it instead cannot reserve the retry: refused there
    events = [*start, *sends, landed[2], _s("DecodeAbort", observed={"d": "quarantined"})]
    v = check_text(_log("handoff_tp2to1", *events))
    assert not v.conforms and v.event == events[-1]


def test_open_turns_the_end_of_log_check_off(capsys: pytest.CaptureFixture[str]) -> None:
    stall = str(TRACES / "bug_stall_untimed.jsonl")
    rc, out, _ = cli_json(capsys, stall)
    assert (rc, out["line"], out["properties"]) == (1, 12, ["NoDeadlock"])
    rc, out, _ = cli_json(capsys, stall, "--open")
    assert (rc, out["conforms"]) == (0, True)


def test_human_output_prints_the_refuted_explanation(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(str(TRACES / "bug_quiesce_under_write.jsonl")) == 1
    out = capsys.readouterr().out
    assert "line 8" in out and "refuted by line 9" in out
    assert "assumed before line 8: DecodeReceiveChunk" in out
