"""The liveness checks added for issue #11, each broken by a one-edit bug of the spec
that the older checks pass: RecoverWithoutTimeout (a retry that reuses its epoch),
ReleaseWhileRunning (a commit that never sends its Ack), NoDeadlock without the client
(a hand-built graph where only a cancel leaves a wedge).

An edited spec runs in a subprocess on a temporary copy, so this process keeps the
real one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_checks.explicit.explore import Graph
from model_checks.explicit.liveness import check_liveness
from spec.config import Config
from spec.state import CANCELLED, FINISHED, RUNNING, WRITABLE, Req, World

ROOT = Path(__file__).resolve().parents[2]
# one request, one block, TP 1: tiny worlds (hundreds of states)
SMALL = {"blocks": 1, "cap_p": 1, "cap_d": 1, "cancel": False, "max_attempts": 2}

_PROBE = """
import json, sys
from model_checks.explicit.explore import explore
from model_checks.explicit.liveness import check_liveness
from spec.config import Config
cfg = json.loads(sys.argv[1])
cfg["fault_kinds"] = frozenset(cfg.get("fault_kinds", []))
c = Config(name="probe", doc="probe", **cfg)
g = explore(c)
bad = sorted({*g.first_violation, *g.first_step_violation})
bad += [r.prop for r in check_liveness(g) if not r.holds]
print(json.dumps(bad))
"""


def _violated(tmp: Path, edit: tuple[str, str, str] | None, **cfg: object) -> list[str]:
    """The properties the (edited) spec breaks on a Config built from ``cfg``."""
    shutil.copytree(ROOT / "spec", tmp / "spec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "model_checks", tmp / "model_checks", ignore=shutil.ignore_patterns("__pycache__")
    )
    if edit is not None:
        rel, old, new = edit
        f = tmp / rel
        text = f.read_text()
        assert text.count(old) == 1, f"the edit's anchor is not unique in {rel}"
        f.write_text(text.replace(old, new))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(cfg)],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


MISMATCH = {**SMALL, "faults": 1, "fault_kinds": ["mismatch"]}
REUSE_EPOCH = ("spec/actions_prefill.py", "    e = r.ep + 1\n", "    e = max(r.ep, 1)\n")
NO_ACK = (
    "spec/actions_decode.py",
    "    net = send(w, r.net, msg(M_ACK, r.dep))\n    if r.st == RUNNING:",
    "    net = r.net\n    if r.st == RUNNING:",
)


def test_small_worlds_hold(tmp_path: Path) -> None:
    assert _violated(tmp_path, None, **MISMATCH) == []


def test_retry_reusing_its_epoch_needs_a_timeout(tmp_path: Path) -> None:
    """After a refused manifest the retry reuses epoch 1; decode has fenced epoch 1,
    so only a timeout ends the run. FairTermination (no faults) cannot see it."""
    bad = _violated(tmp_path, REUSE_EPOCH, **MISMATCH)
    assert "RecoverWithoutTimeout" in bad
    assert "FairTermination" not in bad


def test_commit_without_ack_keeps_the_source(tmp_path: Path) -> None:
    """Decode commits but never sends its Ack: the source stays frozen for the whole
    decode, then is freed when the request ends, so every run still ends quiescent."""
    bad = _violated(tmp_path, NO_ACK, **SMALL)
    assert bad == ["ReleaseWhileRunning"]


def _graph(states: list[World], edges: list[tuple[int, int, str]]) -> Graph:
    c = Config(name="hand", doc="hand-built graph")
    g = Graph(config=c, mutants=frozenset(), symmetry=False)
    g.states.extend(states)
    g.depth.extend(range(len(states)))
    g.parent.extend([0, *range(len(states) - 1)])
    g.parent_label.extend([("", 0, 0)] + [(n, 0, 0) for _, _, n in edges[: len(states) - 1]])
    for k in range(len(states)):
        g.first_edge.append(len(g.src))
        for s, d, name in edges:
            if s == k:
                g.src.append(s)
                g.dst.append(d)
                g.lab.append((name, 0, 0))
    return g


@pytest.mark.parametrize("exit_action,holds", [("ClientCancel", False), ("DecodeFinish", True)])
def test_no_deadlock_needs_a_way_out_without_the_client(exit_action: str, holds: bool) -> None:
    """A wedge that only a cancel leaves fails NoDeadlock; a protocol exit passes."""
    wedge = World(reqs=(Req(st=RUNNING, d=WRITABLE),))
    end = World(reqs=(Req(st=CANCELLED if exit_action == "ClientCancel" else FINISHED),))
    g = _graph([World(reqs=(Req(),)), wedge, end], [(0, 1, "PrefillAdmit"), (1, 2, exit_action)])
    (res,) = check_liveness(g, only=["NoDeadlock"])
    assert res.holds is holds
    if not holds:
        assert res.note == "only a client cancel leads to a quiescent terminal state"
