"""The ``cluster`` surface of ``benchmarks/hostile/corpus.py`` (issue #34's Done-when:
"cluster options and signals"): ``kvown cluster`` given bad, huge and negative option
values (in process: 2, ``{"error"}`` under ``--json``, no process started), a few legal
extremes and a non-empty ``--log-dir`` run for real (each in a process of its own: exit 0
or 1 with its JSON report, 0 blocks leaked, the user's files in the folder untouched), and
SIGTERM, SIGHUP and SIGINT (to the router alone, and Ctrl-C to its group) at seeded
random points of a run.

A signal case reads the router's caught-signal mask (``SigCgt`` of ``/proc/PID/status``)
just before it signals: once kvown's handlers are installed the signal must end the run
with exit 130 and one ``kvown cluster: interrupted`` line within 10 s; before them (the
interpreter still starting: at load, ``site`` and the first imports take up to a second)
Python's default stands (killed by the signal; for SIGINT its KeyboardInterrupt out of an
import), with nothing started; those cases are counted in ``STARTUP``. Either way, within
10 s of the signal no process of the run's tree and no file in its ``TMPDIR`` is left."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.hostile.surfaces import fingerprint
from tests.cli.exits.test_interrupts import _alive, _cmdlines, _tree

ROOT = Path(__file__).resolve().parents[2]
END_S = 10.0
Outcome = str
Case = tuple[str, Callable[[], Outcome]]

# option -> values it must refuse (2): below and above its range, negative, huge, not a number
NUMERIC = {
    "--requests": ("0", "-1", "100001"), "--prefill-tp": ("0", "5", "-2"),
    "--decode-tp": ("0", "9", "2"), "--decode-workers": ("0", "5"),
    "--restarts": ("-1", "9"), "--retries": ("-1", "5"),
    "--cancel": ("-0.1", "1.01"), "--delay": ("-1", "2"), "--drop": ("1.5", "-1e-9"),
    "--delay-ms": ("-1", "10001", "1e9"), "--timeout": ("0", "-3", "601", "1e-300"),
    "--deadline": ("0", "-1", "1e30"), "--seed": ("-1",), "--steps": ("-1", "257"),
    "--max-inflight": ("0", "65"), "--layers": ("0", "9"), "--kv-heads": ("0", "9"),
    "--head-dim": ("7", "129"), "--block-size": ("0", "65"),
}  # fmt: skip
NOT_NUMBERS = ("", " ", "x", "nan", "inf", "-inf", "1e309", "9" * 25, "0x10", "1" * 5000,
               "--json")  # fmt: skip
# refused by the integer options only (Python's float takes "1_0" and a full-width digit)
NOT_INTEGERS = ("1_0", "\uff15", "1.0", "1e3", "--5", "5 5")
FLOATS = {"--cancel", "--delay", "--drop", "--delay-ms", "--timeout", "--deadline"}
KILLS = ("", "bogus", "prefill", "prefill:0", "prefill:0@", "prefill:0@30", "prefill:-1@30%",
         "prefill:9@30%", "prefill:0@101%", "prefill:0@100%", "prefill:0@-5%", "prefill:0@nan%",
         "prefill:99999999999999999999999@30%", "decode:7@50%", "decode:0@1e400%", "random:5",
         "@", "%", "prefill:0@30%%", "prefill:0@30%,decode@20%")  # fmt: skip
MUTANTS = ("", "nope", "../../etc/passwd", "cancel_ignored ", "x" * 5000)


def option_cases(cli: Callable[..., Outcome], d: Path) -> Iterator[Case]:
    """Bad option values, each refused before any process starts: 2 (and ``{"error"}``)."""
    argvs: list[list[str]] = []
    for opt, values in NUMERIC.items():
        more = NOT_NUMBERS if opt in FLOATS else (*NOT_NUMBERS, *NOT_INTEGERS)
        argvs += [[opt, v] for v in (*values, *more)]
    argvs += [["--kill", k] for k in KILLS] + [["--mutant", m] for m in MUTANTS]
    a_file = d / "a-file"
    a_file.write_text("the user's\n")
    argvs += [["--log-dir", v] for v in ("", " ", str(a_file), str(a_file / "sub"))]
    if os.geteuid() != 0:  # root writes anywhere
        ro = d / "read-only"
        ro.mkdir()
        ro.chmod(0o500)
        argvs.append(["--log-dir", str(ro)])
    argvs += [["--requests"], ["--seed", "1", "--seed"], ["--bogus"], ["--kill"]]
    for argv in argvs:
        name = " ".join(a[:24] for a in argv)
        yield f"cluster {name}", lambda a=argv: cli(["cluster", *a], {2})
        yield (
            f"cluster {name} --json",
            lambda a=argv: cli(["cluster", *a, "--json"], {2}, json_error=True),
        )


def _start(argv: list[str], tmp: Path) -> subprocess.Popen[bytes]:
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(tmp),
        "KVOWN_PROGRESS_SECONDS": "0.5",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "kvown_cli.main", "cluster", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
        start_new_session=True,  # its own group, as a shell's job is: Ctrl-C reaches it all
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def _left(seen: dict[int, str], tmp: Path, since: float, keep: Path | None = None) -> str:
    """What is left of the run END_S after ``since`` ("" when nothing but ``keep``)."""

    def files() -> list[str]:
        return sorted(x.name for x in tmp.iterdir() if x != keep)

    while (_alive(seen) or files()) and time.monotonic() - since < END_S:
        time.sleep(0.1)
    procs = _cmdlines(_alive(seen))
    return f"left processes {procs} files {files()}" if procs or files() else ""


def _end(p: subprocess.Popen[bytes], seen: dict[int, str]) -> None:
    """End what this case started, by pid (the router's group, then any worker left)."""
    for pid in [p.pid, *_alive(seen)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.communicate()


def run_case(argv: list[str], tmp: Path, limit_s: float, want: int = 0) -> Outcome:
    """A legal run to its end: exit ``want`` with its JSON report (0: ``ok``), 0 blocks
    leaked, nothing left."""
    p = _start([*argv, "--json"], tmp / "tmp")
    seen: dict[int, str] = {}
    t0 = time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < limit_s:
        _tree(p.pid, seen)
        time.sleep(0.2)
    if p.poll() is None:
        _end(p, seen)
        return f"hang: no end in {limit_s:.0f} s"
    out, err = p.communicate()
    text = err.decode(errors="replace")
    if p.returncode not in (0, 1) or "Traceback" in text:
        raise RuntimeError(f"exit {p.returncode}: {text[-200:]}")
    rep = json.loads(out)
    if rep["leaked_blocks"]:
        return f"held {rep['leaked_blocks']} blocks after the run"
    if p.returncode != want or (p.returncode == 0) != rep["ok"]:
        keys = ("requests", "conforms", "integrity_errors", "unreported_workers")
        why = {k: rep[k] for k in keys}
        return f"exit {p.returncode} (want {want}), ok={rep['ok']}: {why}"
    keep = Path(rep["log_dir"])  # the run's logs (a new temporary folder without --log-dir)
    left = _left(seen, tmp / "tmp", time.monotonic(), keep)
    return "ok" if not left else f"wrong: {left}"


def _caught(pid: int, sig: int) -> bool:
    """Whether kvown's own handler will take ``sig``: it installs SIGINT's, SIGTERM's and
    SIGHUP's together (``kvown_cli.main``); Python alone catches SIGINT only."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return all(mask >> (s - 1) & 1 for s in (sig, signal.SIGTERM, signal.SIGHUP))
    return False


# signals that landed before kvown's handlers (the interpreter starting): Python's default
STARTUP: list[str] = []

# what the run writes as it goes: its progress ticks
_ROUTINE = re.compile(r"kvown cluster: \d")


def signal_case(sig: int, group: bool, at_s: float, tmp: Path, logs: Path) -> Outcome:
    """``kvown cluster`` signalled ``at_s`` after its start (SIGINT to the group: Ctrl-C)."""
    p = _start(["--requests", "400", "--json", "--log-dir", str(logs)], tmp / "tmp")
    seen: dict[int, str] = {}
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < at_s and p.poll() is None:
            _tree(p.pid, seen)
            time.sleep(0.02)
        if p.poll() is not None:
            return f"wrong: ended (exit {p.returncode}) before its signal at {at_s:.1f} s"
        _tree(p.pid, seen)
        caught = _caught(p.pid, sig)
        t_sig = time.monotonic()
        os.killpg(p.pid, sig) if group else os.kill(p.pid, sig)
        try:
            _, err = p.communicate(timeout=END_S)
        except subprocess.TimeoutExpired:
            return f"hang: no end {END_S:.0f} s after the signal"
        lines = [ln for ln in err.decode(errors="replace").splitlines() if not _ROUTINE.match(ln)]
        if not caught and p.returncode != 130:  # Python's own: killed, or (SIGINT) its
            # KeyboardInterrupt out of an import, or its fatal "init_import_site" error
            python_s = p.returncode == -sig or (sig == signal.SIGINT and p.returncode == 1)
            if not python_s or any("kvown" in ln and "Error" in ln for ln in lines):
                return f"wrong: exit {p.returncode} before kvown's handlers: {lines[-2:]}"
            STARTUP.append(f"{signal.Signals(sig).name} at {at_s:.2f} s: exit {p.returncode}")
        elif "Traceback" in "\n".join(lines):
            raise RuntimeError(f"exit {p.returncode}: {lines[-3:]}")
        elif p.returncode != 130:
            return f"wrong: exit {p.returncode} after kvown's handlers took {sig}"
        elif len(lines) != 1 or not lines[0].startswith("kvown cluster: interrupted"):
            return f"wrong: exit 130 with the lines {lines[:3]}"
        left = _left(seen, tmp / "tmp", t_sig)
        return "ok" if not left else f"wrong: {left}"
    finally:
        if p.poll() is None or _alive(seen):
            _end(p, seen)


LEGAL: dict[str, tuple[list[str], int]] = {  # legal extremes, each run to its end, its exit
    "one request, no decode step": (["--requests", "1", "--steps", "0"], 0),
    # each attempt fails after two lost Readies (two bounded waits): no retry, or minutes
    "every Ready dropped": (["--requests", "4", "--drop", "1", "--retries", "0"], 0),
    "every request cancelled": (["--requests", "6", "--cancel", "1"], 0),
    "every message delayed 200 ms": (["--requests", "4", "--delay", "1", "--delay-ms", "200"], 0),
    "64 in flight, a block a token": (
        ["--requests", "16", "--max-inflight", "64", "--block-size", "1"], 0
    ),
    "the largest seed": (["--requests", "4", "--seed", str(2**63 - 1)], 0),
    # the run's bound: the requests not ended by then are "lost" (exit 1, README)
    "a 2 s deadline": (["--requests", "400", "--deadline", "2"], 1),
}  # fmt: skip


def process_cases(d: Path, quick: bool, seed: int = 0) -> Iterator[Case]:
    """Real runs: the legal extremes, a non-empty --log-dir, and the signals."""
    for k, (name, (argv, rc)) in enumerate(LEGAL.items()):
        yield f"cluster run: {name}", lambda a=argv, k=k, rc=rc: run_case(a, d / f"r{k}", 240, rc)
    yield "cluster run: a --log-dir with the user's files", lambda: user_log_dir(d / "user")
    rng = random.Random(seed)
    randoms = tuple(round(rng.uniform(0.5, 12.0), 2) for _ in range(2 if quick else 6))
    points = (0.0, 0.05, 0.3, *randoms)
    sigs = (
        (signal.SIGTERM, False),
        (signal.SIGHUP, False),
        (signal.SIGINT, True),
        (signal.SIGTERM, True),
        (signal.SIGHUP, True),
    )
    for k, at in enumerate(points):
        for j, (sig, group) in enumerate(sigs):
            if quick and (k + j) % 2:
                continue
            to = "the group" if group else "the router"
            yield (
                f"cluster {sig.name} to {to} at {at:.2f} s",
                lambda s=sig, g=group, at=at, c=f"s{k}-{j}": signal_case(
                    s, g, at, d / c, d / c / "logs"
                ),
            )


def user_log_dir(d: Path) -> Outcome:
    """A --log-dir holding the user's files (logs by the cluster's own names among them):
    the run goes to a new folder inside, every user file stays as it was."""
    logs = d / "logs"
    for name in ("notes.jsonl", "merged.jsonl", "prefill0.jsonl", "run-1/decode0.jsonl"):
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_text(f"{name}: the user's own\n")
    before = {str(p): fingerprint(p) for p in logs.rglob("*") if p.is_file()}
    got = run_case(["--requests", "4", "--log-dir", str(logs)], d, 240)
    after = {str(p): fingerprint(p) for p in logs.rglob("*") if p.is_file()}
    touched = sorted(k for k in before if after.get(k) != before[k])
    if touched:
        return f"touched {touched}"
    new = {Path(k).relative_to(logs).parts[0] for k in set(after) - set(before)}
    if got == "ok" and (len(new) != 1 or new == {"run-1"}):
        return f"wrong: the run's logs went to {sorted(new)}"
    return got
