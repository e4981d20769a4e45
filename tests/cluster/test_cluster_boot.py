"""A worker's start judged by its pid (``refimpl.cluster.procs.Boot``, issue #35's loaded
machine): a worker that dies at its start is named at once with its exit code, one that
hangs (alive, asleep, no CPU) is named after ``STALL_S``, and a slow one that makes
progress is waited for past the nominal bound, up to the hard outer bound.

The judgement is tested on a fake clock and a fake ``/proc`` reading (no time is
asserted); the router's start is tested with real stand-in worker processes (one that
exits 7, others asleep), each ended by its pid. Before the fix the router waited the
fixed 60 s + 10 s per worker for all of them and then named every worker as "did not
start", the dead one no differently from the rest."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from model_checks import children
from refimpl.cluster import procs
from refimpl.cluster.procs import HELLO_MAX_S, STALL_S, Boot, WorkerStartError
from refimpl.cluster.router import ClusterConfig, Router
from refimpl.cluster.worker import WorkerArgs


class _Proc:
    """What ``Boot.verdict`` reads of a ``Popen``: its pid and ``poll()``."""

    def __init__(self, rc: int | None = None) -> None:
        self.pid, self.rc = 4242, rc

    def poll(self) -> int | None:
        return self.rc


def _judge(readings: list[tuple[float, tuple[str, int] | None]], nominal: float = 90.0) -> list:
    """The verdicts of one alive process at each (time, /proc reading)."""
    seen: list[tuple[str, int] | None] = [None]
    b = Boot(nominal, probe=lambda pid: seen[0])
    b.add("p0", 0.0)
    out = []
    for now, reading in readings:
        seen[0] = reading
        out.append(b.verdict("p0", _Proc(), now))  # type: ignore[arg-type]
    return out


def test_a_dead_worker_is_named_at_once_with_its_exit_code() -> None:
    b = Boot(90.0, probe=lambda pid: ("S", 0))
    b.add("d0", 0.0)
    why = b.verdict("d0", _Proc(rc=7), 0.5)  # type: ignore[arg-type]
    assert why is not None and "d0" in why and "code 7" in why


def test_a_hung_worker_is_named_after_the_stall_not_before() -> None:
    asleep = ("S", 100)  # alive, asleep, the same CPU ticks from its first reading on
    verdicts = _judge([(1.0, asleep), (1.0 + STALL_S - 1, asleep), (2.0 + STALL_S, asleep)])
    assert verdicts[:2] == [None, None]
    assert verdicts[2] is not None and "hung" in verdicts[2] and "p0" in verdicts[2]


def test_a_slow_worker_making_progress_is_waited_for_past_the_nominal_bound() -> None:
    # Using CPU (ticks move), or runnable and waiting for one (R: a loaded machine).
    times = [10.0 * k for k in range(1, 50)]  # to 490 s, past 90 s and the stall
    readings = [("R" if k % 2 else "S", k // 2) for k in range(1, 50)]
    assert _judge(list(zip(times, readings, strict=True))) == [None] * len(times)


def test_the_outer_bound_holds_however_busy_the_worker_is() -> None:
    late = _judge([(HELLO_MAX_S / 2, ("R", 1)), (HELLO_MAX_S + 1, ("R", 2))])
    assert late[0] is None and late[1] is not None and "still starting" in late[1]


def test_without_proc_the_nominal_bound_is_the_bound() -> None:
    early, late = _judge([(89.0, None), (91.0, None)])
    assert early is None and late is not None and "within 90 s" in late


_SLEEP = "import time; time.sleep(600)"


def _router_with_stand_ins(tmp_path: Path, code: dict[str, str]) -> Router:
    """A router whose workers are stand-ins (``python -c code[name]``), never saying hello."""
    r = Router(ClusterConfig(requests=1, log_dir=str(tmp_path / "logs")))

    def start(a: WorkerArgs) -> None:
        r.procs.procs[a.name] = children.popen([sys.executable, "-c", code.get(a.name, _SLEEP)])

    r.procs.start = start  # type: ignore[method-assign]
    return r


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_router_names_a_worker_that_died_at_its_start_at_once(tmp_path: Path) -> None:
    r = _router_with_stand_ins(tmp_path, {"p1": "import sys; sys.exit(7)"})
    try:
        with pytest.raises(WorkerStartError) as info:
            r.start()
        alive = {w: r.procs.alive(w) for w in ("p0", "d0")}
    finally:
        r.procs.close(grace_s=0.0)  # SIGKILL by pid, each reaped
        r.log.close()
    msg = str(info.value)
    assert "p1" in msg and "exited with code 7" in msg, msg
    assert "p0" not in msg and "d0" not in msg, msg  # the others were still starting
    assert alive == {"p0": True, "d0": True}  # named while they were alive, not after them


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_router_names_a_hung_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "STALL_S", 1.0)  # every stand-in sleeps: all hang
    r = _router_with_stand_ins(tmp_path, {})
    try:
        with pytest.raises(WorkerStartError, match="hung before its hello") as info:
            r.start()
    finally:
        r.procs.close(grace_s=0.0)
        r.log.close()
    assert "no CPU used" in str(info.value)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_kvown_cluster_reports_a_failed_start_as_one_error_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not an internal error (exit 3, "a bug in kvown"): a worker that did not start is a
    failure of the run, named in one ``error:`` line."""
    from kvown_cli.main import main

    def start(self: procs.Procs, a: WorkerArgs) -> None:
        self.procs[a.name] = children.popen([sys.executable, "-c", "import sys; sys.exit(7)"])

    monkeypatch.setattr(procs.Procs, "start", start)
    rc = main(["cluster", "--requests", "1", "--log-dir", str(tmp_path / "logs")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert line.startswith("error: kvown cluster: workers did not start:"), line
    assert "exited with code 7" in line
