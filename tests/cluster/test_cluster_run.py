"""Real cluster runs: separate processes on loopback, gloo point to point, a TCPStore.

Each run starts 3 worker processes (2 prefill ranks, 1 decode) and ends every one of them
by pid (``Procs.close`` in the router's ``finally``). Every wait in them is bounded.
"""

from __future__ import annotations

from pathlib import Path

from model_checks.conformance import check_file
from refimpl.cluster.router import ClusterConfig, run_cluster


def _run(tmp_path: Path, **kw: object) -> dict[str, object]:
    cfg = ClusterConfig(log_dir=str(tmp_path / "logs"), timeout_s=5.0, deadline_s=300.0, **kw)  # type: ignore[arg-type]
    rep = run_cluster(cfg)
    j = rep.to_json()
    j["ok"] = rep.ok
    j["reasons_all"] = rep.reasons
    j["outcomes"] = rep.outcomes
    return j


def test_bounded_run_two_prefill_ranks_one_decode(tmp_path: Path) -> None:
    j = _run(tmp_path, requests=20, cancel_p=0.2, delay_p=0.2, delay_s=0.01, seed=1)
    counts = j["requests"]
    assert counts["lost"] == 0 and sum(counts.values()) == 20, counts
    assert counts["finished"] >= 10, counts
    assert j["leaked_blocks"] == 0 and j["held_by"] == {"p0": 0, "p1": 0, "d0": 0}
    assert j["integrity_errors"] == [] and j["crashed"] == []
    assert j["tokens_match_reference"] is True
    assert j["conforms"] is True, j["violations"]
    assert j["checked_requests"] == 20
    for rid, outcome in j["outcomes"].items():  # type: ignore[attr-defined]
        assert outcome == "finished" or j["reasons_all"][rid], rid  # type: ignore[index]
    assert j["handoff_over_raw"] is not None and j["p50_ms"] is not None
    # a per-request log is what `kvown check-trace` reads, and it conforms there too
    assert check_file(tmp_path / "logs" / "requests" / "r0.jsonl").conforms


def test_kill_a_prefill_rank_mid_run(tmp_path: Path) -> None:
    j = _run(tmp_path, requests=12, kill="prefill:1@25%", seed=2)
    counts = j["requests"]
    assert j["killed"] == ["p1"] and j["declared_dead"] == ["p1"]
    assert counts["lost"] == 0 and counts["failed"] >= 1, counts
    assert j["leaked_blocks"] == 0 and j["held_by"] == {"p0": 0, "d0": 0}
    assert j["tokens_match_reference"] is True
    assert j["conforms"] is True, j["violations"]
    assert j["ok"] is True
    merged = (tmp_path / "logs" / "merged.jsonl").read_text()
    assert '"EnvCrash","args":{"worker":"prefill"}' in merged


def test_mutant_run_is_flagged(tmp_path: Path) -> None:
    j = _run(tmp_path, requests=3, mutant="release_before_install", raw_baseline=False)
    assert j["requests"]["lost"] == 0
    assert j["conforms"] is False
    # the source freed before install breaks NothingLost, and NoReuseUnderIO (listed
    # first, more specific) where its last writes are still in flight
    for v in j["violations"]:  # type: ignore[attr-defined]
        assert "NothingLost" in v["properties"], v
        assert set(v["properties"]) <= {"NoReuseUnderIO", "NothingLost"}, v
    assert j["ok"] is False
