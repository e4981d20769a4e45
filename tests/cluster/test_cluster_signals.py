"""``kvown cluster`` ended by SIGTERM or SIGHUP as by Ctrl-C (issue #34): one
``interrupted`` line with what was done, exit 130, and every worker process ended (before,
the router died at once with no line, and its workers were left to their heartbeats)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out |= {int(x) for x in text}
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.nightly
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminate_signal_ends_the_cluster_like_ctrl_c(tmp_path: Path, sig: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = tmp_path / "logs"
    p = subprocess.Popen(
        [sys.executable, "-m", "kvown_cli.main", "cluster", "--requests", "400",
         "--log-dir", str(logs)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (logs / "d0.jsonl").exists() or not (logs / "d0.jsonl").stat().st_size:
            assert p.poll() is None and time.monotonic() < deadline, "the cluster never served"
            time.sleep(0.5)
        workers = _children(p.pid)
        assert len(workers) >= 3  # p0, p1, d0
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines = [ln for ln in err.splitlines() if "interrupted" in ln]
    assert p.returncode == 130 and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("kvown cluster: interrupted after") and "requests" in lines[0]
    assert not [w for w in workers if _alive(w)]
