"""Cluster runs with no fault injected (issue #34 item 9, #31): they exit 0 and leak nothing.

Both cases were found by the hostile corpus (``benchmarks/hostile/cluster_cases.py``):

- decode's pool full (block size 1, 64 requests in flight): decode refused the handoffs it
  had no room for with a Nack, logged ``DecodeReject``, which no one-request log can explain
  (its config's decode pool always has room for its one request): flagged ``Fencing``.
- a run cut by its deadline: decode said bye with the blocks of the requests it was still
  decoding (``held_by`` d0 > 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from refimpl.cluster.router import ClusterConfig, run_cluster
from refimpl.cluster.workload import ModelSpec
from tests.cluster.test_cluster_run import _alive


def test_a_full_decode_pool_makes_the_handoff_wait_not_a_refusal(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        requests=16, max_inflight=64, model=ModelSpec(block_size=1), steps=20, timeout_s=5.0,
        deadline_s=300.0, log_dir=str(tmp_path / "logs"), raw_baseline=False,
    )  # fmt: skip
    rep = run_cluster(cfg)
    j = rep.to_json()
    assert rep.pids and not [p for p in rep.pids if _alive(p)]
    assert j["conforms"] is True, j["violations"]
    assert j["leaked_blocks"] == 0, j["held_by"]
    assert j["requests"]["lost"] == 0 and j["requests"]["failed"] == 0, rep.reasons
    merged = (tmp_path / "logs" / "merged.jsonl").read_text()
    assert '"DecodeReject"' not in merged  # no handoff refused for want of room


def test_a_run_cut_by_its_deadline_gives_back_every_block(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        requests=60, max_inflight=8, steps=64, deadline_s=2.0, timeout_s=5.0,
        log_dir=str(tmp_path / "logs"), raw_baseline=False,
    )  # fmt: skip
    rep = run_cluster(cfg)
    j = rep.to_json()
    assert rep.pids and not [p for p in rep.pids if _alive(p)]
    assert j["requests"]["lost"] > 0, j["requests"]  # the deadline cut requests in flight
    assert j["unreported_workers"] == []
    assert j["leaked_blocks"] == 0 and set(j["held_by"].values()) == {0}, j["held_by"]
    assert j["integrity_errors"] == []
    assert j["conforms"] is True, j["violations"]


@pytest.mark.nightly
def test_the_corpus_commands_at_full_size(tmp_path: Path) -> None:
    """The hostile corpus's two commands as it ran them: 16 requests at block size 1 with
    64 in flight (every one conforms), and 400 requests cut by a 2 s deadline (0 held)."""
    full = ClusterConfig(
        requests=16, max_inflight=64, model=ModelSpec(block_size=1),
        log_dir=str(tmp_path / "a"), deadline_s=600.0,
    )  # fmt: skip
    j = run_cluster(full).to_json()
    assert j["ok"] is True and j["conforms"] is True, j["violations"]
    cut = ClusterConfig(requests=400, deadline_s=2.0, log_dir=str(tmp_path / "b"))
    j = run_cluster(cut).to_json()
    assert j["requests"]["lost"] > 0 and j["leaked_blocks"] == 0, j["held_by"]
    assert j["conforms"] is True, j["violations"]
