"""A self-check of issue #34's Done-when: a few thousand generated hostile cases across the
surfaces kvown reads from outside, each answered within 10 s, counted.

    python benchmarks/hostile/corpus.py [--quick]

Surfaces (the generators of the tests are reused, not copied):

- ``check-trace``: every one-line edit of ``tests/model_checks/test_hostile_logs.py`` and
  its hostile headers (want 2), long hostile lines (escaped-quote runs, deep brackets, a
  line past the cap: 2), the conforming logs of ``repro/traces`` (0) and its bug logs (1);
- ``replay``: a counterexample ``kvown check --cex-dir`` wrote, each top-level field and
  each of the first steps' fields set to every literal of
  ``BAD_LITERALS`` of ``tests/spec/hostile_manifests.py``, truncations, bombs (a document that is
  not the format wants 2; one that still is may replay to 0 or 1, or name a bad name: 2);
- ``manifest``: a Sender's real manifest, each field set to every bad literal, and
  ``hostile_documents()``, each sent as a ``DistTransport`` frame (its real reader,
  ``_arrive``) and what it files handed to a ``Receiver``: never accepted, no block held;
- ``frame``: hostile ``DistTransport`` frames (tests/refimpl/test_hostile_headers.HOSTILE,
  every truncation of a batch frame, wrong types): dropped and counted, the next filed;
- ``disk``: tier folders with a FIFO, a folder, a symlink out, a truncated file (every
  32nd cut), a huge header length, junk metadata, odd temp names at a key: ``DiskTier()``
  opens, ``load`` is a miss, ``reload`` holds no block, the file outside is untouched;
- ``cli``: misuse of every command's options (2, ``{"error"}`` under ``--json``), a folder
  and a missing file as the input of ``check-trace`` and ``replay`` (2);
- ``process``: the largest inputs (a 20 MB bad log, bracket bombs at replay's 16 MiB cap,
  60 MB files past it) and a FIFO whose writer writes a torn line and leaves, each in a
  kvown process of its own under ``/usr/bin/time``: 2, and its peak RSS under 256 MB. (A
  FIFO no writer ever opens is waited on, as ``cat`` does: that is how a log streams.)
- ``cluster``: bad, huge and negative values of every ``kvown cluster`` option, ``--kill``
  and ``--mutant`` forms, bad ``--log-dir`` paths (2, ``{"error"}``);
  ``cluster-runs``: legal extremes and a non-empty ``--log-dir`` run for real, SIGTERM,
  SIGHUP and SIGINT at seeded points of a run (``benchmarks/hostile/cluster_cases.py``).
  ``--only cluster,cluster-runs`` runs just these.

CLI cases run in this process (``kvown_cli.main.main``) with a 10 s alarm, from a folder
of "user" files that is compared before and after. Columns: cases, hangs (no answer in
10 s), tracebacks (an exception out of the entry point, or exit 3), wrong exit codes or
outcomes, blocks held after a refusal, user files touched; then this process's peak RSS
(``ru_maxrss``) and each kvown process's. Exit 1 if any case failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.hostile import cluster_cases  # noqa: E402
from benchmarks.hostile.surfaces import (  # noqa: E402
    disk_cases,
    fingerprint,
    frame_cases,
    manifest_cases,
)
from kvown_cli.main import main as kvown  # noqa: E402
from spec.strict_json import StrictJSONError, loads_strict  # noqa: E402
from tests.model_checks.test_hostile_logs import CONFORMING, HEADER_EDITS, TRACES, cases  # noqa: E402
from tests.spec.hostile_manifests import BAD_LITERALS  # noqa: E402

TIMEOUT_S = 10
Outcome = str  # "ok", or what went wrong: "exit 0 (want 2)", "held 3", "accepted", ...


class Hang(BaseException):  # not an Exception: kvown's main catches those
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Hang


def run_case(fn: Callable[[], Outcome], alarm_s: int = TIMEOUT_S) -> tuple[str, str]:
    """(kind, detail): kind is ok, hang, traceback, wrong, held or touched (a case that
    runs processes bounds them itself, reports "hang: ..." and gets a longer alarm)."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(alarm_s)
    try:
        got = fn()
    except Hang:
        return "hang", ""
    except Exception as e:  # noqa: BLE001 - counted, that is the point
        return "traceback", f"{type(e).__name__}: {str(e)[:120]}"
    finally:
        signal.alarm(0)
    if got == "ok":
        return "ok", ""
    kind = got.split(" ")[0].rstrip(":")
    return kind if kind in ("held", "touched", "hang") else "wrong", got


# ------------------------------------------------------------------ the CLI, in process
def cli(argv: list[str], want: set[int], *, json_error: bool = False) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = kvown(argv)
    if rc == 3 or "Traceback" in err.getvalue():
        raise RuntimeError(f"exit {rc}: {err.getvalue()[-200:]}")
    if rc not in want:
        return f"exit {rc} (want {sorted(want)}): {err.getvalue()[-120:]!r}"
    if json_error and rc == 2 and '"error"' not in out.getvalue():
        return "no {error} under --json"
    return "ok"


def write(d: Path, name: str, data: str | bytes) -> str:
    p = d / name
    p.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return str(p)


def trace_cases(d: Path, quick: bool) -> Iterator[tuple[str, Callable[[], Outcome]]]:
    every = 7 if quick else 1
    for k, (cid, text, _line, _edit) in enumerate(cases()):
        if k % every == 0:
            p = write(d, f"t{k}.jsonl", text)
            yield cid, lambda p=p: cli(["check-trace", p], {2})
    first = CONFORMING[0].read_text().splitlines()
    body = "\n".join(first[1:]) + "\n"
    for name, head in HEADER_EDITS.items():
        p = write(d, f"h{len(name)}{abs(hash(name))}.jsonl", head + "\n" + body)
        yield f"header: {name}", lambda p=p: cli(["check-trace", p], {2})
    bombs = {
        "an action of 60 KB of escaped quotes": '{"action":"' + '\\"' * 30_000 + '"}',
        "unterminated escaped quotes": '{"a":"' + '\\"' * 30_000,
        "a line past the cap": '{"a":"' + "x" * (1 << 17) + '"}',
        "2 MB of open brackets": "[" * (2 << 20),
        "1 MB of empty pairs": "[]" * (1 << 19),
        "deep inside the cap": '{"a":' + "[" * 30_000 + "]" * 30_000 + "}",
    }
    for name, line in bombs.items():
        p = write(d, f"b{len(name)}.jsonl", first[0] + "\n" + first[1] + "\n" + line + "\n")
        yield f"bomb: {name}", lambda p=p: cli(["check-trace", p], {2})
    for path in sorted(TRACES.glob("*.jsonl")):
        want = {0} if path in CONFORMING else {1} if path.name.startswith("bug_") else None
        if want is not None:
            yield f"trace: {path.stem}", lambda p=str(path), w=want: cli(["check-trace", p], w)


# ------------------------------------------------------------------ replay
def _format_ok(doc: object) -> bool:
    """Whether a parsed document has the counterexample format's shape (replay may still
    refuse a name it does not know: 2)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), str):
        return False
    steps = doc.get("trace")
    return isinstance(steps, list) and all(
        isinstance(s, dict) and isinstance(s.get("action"), str) and isinstance(s.get("args"), dict)
        for s in steps
    )


def replay_cases(d: Path, cex: str) -> Iterator[tuple[str, Callable[[], Outcome]]]:
    good = json.loads(cex)
    texts: list[tuple[str, str]] = []
    marker = '"__HOSTILE__"'
    for key in good:
        for lit in (*BAD_LITERALS, "null"):
            texts.append(
                (f"{key}={lit[:16]}", json.dumps({**good, key: "__HOSTILE__"}).replace(marker, lit))
            )
    for i in range(min(3, len(good["trace"]))):
        for key in ("action", "args"):
            for lit in (*BAD_LITERALS, "null"):
                steps = [dict(s) for s in good["trace"]]
                steps[i][key] = "__HOSTILE__"
                doc = json.dumps({**good, "trace": steps}).replace(marker, lit)
                texts.append((f"trace[{i}].{key}={lit[:16]}", doc))
    for cut in range(1, len(cex), max(1, len(cex) // 60)):
        texts.append((f"truncated@{cut}", cex[:cut]))
    texts += [
        ("trace [5]", json.dumps({**good, "trace": [5]})),
        ("violated unhashable", json.dumps({**good, "violated": [["x"]]})),
        ("escaped quotes 64 KB", '{"config":"' + '\\"' * 32_768 + '"}'),
        ("empty", ""),
        ("a BOM", "\ufeff" + cex),
        ("not UTF-8", cex[:-2] + "\udcff}"),
    ]
    for k, (name, text) in enumerate(texts):
        try:
            shaped = _format_ok(
                loads_strict(text, max_bytes=1 << 26, max_depth=64, max_int_digits=64)
            )
        except StrictJSONError:
            shaped = False
        p = write(d, f"c{k}.json", text)
        yield f"replay {name}", lambda p=p, s=shaped: cli(["replay", p], {0, 1, 2} if s else {2})


# ------------------------------------------------------------------ CLI misuse
MISUSE: list[list[str]] = [
    ["bogus"], ["check-trace"], ["check-trace", "--config", "nope", "x.jsonl"],
    ["check-trace", "--budget", "abc", "x.jsonl"], ["replay"], ["replay", "--bogus"],
    ["check", "--mutant", "nope"], ["check", "--config", "nope"], ["check", "--max-states", "-5"],
    ["check", "--jobs", "zero"], ["prove", "--mutant", "nope"], ["list", "--bogus"],
    ["fuzz", "--steps", "abc"], ["fuzz", "--seed", "-1x"], ["mutate", "--jobs", "-1"],
    ["mutate", "--target", "nope"], ["cluster", "--requests", "-1"], ["cluster", "--kill", "bogus"],
    ["cluster", "--delay", "2"], ["cluster", "--prefill-tp", "0"], ["cluster", "--timeout", "nan"],
    ["cluster", "--kill", "prefill:9@30%"], ["cluster", "--decode-tp", "2"],
    ["demo", "--bogus"], ["repro", "--bogus"],
]  # fmt: skip


def misuse_cases(d: Path) -> Iterator[tuple[str, Callable[[], Outcome]]]:
    for argv in MISUSE:
        yield f"cli {' '.join(argv)}", lambda a=argv: cli(a, {2})
        if len(argv) > 1 or argv[0] != "bogus":
            yield (
                f"cli {' '.join(argv)} --json",
                lambda a=argv: cli([*a, "--json"], {2}, json_error=True),
            )
    for cmd in ("check-trace", "replay"):
        yield f"cli {cmd} a folder", lambda c=cmd: cli([c, str(d)], {2})
        yield f"cli {cmd} a missing file", lambda c=cmd: cli([c, str(d / "absent")], {2})


def process(argv: list[str], want: int, feed: bytes | None = None) -> Outcome:
    """``kvown ARGV`` in a process of its own under ``/usr/bin/time`` (its peak RSS goes to
    ``RSS_KB``); ``feed``: the input is a FIFO that a writer opens, fills and leaves."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "kvown_cli.main", *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if feed is not None:
        with open(argv[-1], "wb") as w:  # blocks until kvown opens it for reading
            w.write(feed)
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise Hang from None
    *text, rss = err.decode(errors="replace").rstrip().rsplit("\n", 1)
    RSS_KB.append((int(rss) if rss.isdigit() else -1, " ".join(argv[:1])))
    if proc.returncode == 3 or "Traceback" in "".join(text):
        raise RuntimeError("".join(text)[-200:])
    return "ok" if proc.returncode == want else f"exit {proc.returncode} (want {want})"


RSS_KB: list[tuple[int, str]] = []


def process_cases(d: Path, quick: bool) -> Iterator[tuple[str, Callable[[], Outcome]]]:
    """The largest inputs, each in a process of kvown's own: its memory is measured."""
    mb = 4 if quick else 20
    line = '{"action":"PrefillAdmit","args":{"req":0},"x":"' + "y" * 970 + '"}\n'
    cap = 16 << 20  # replay's size cap
    big: dict[str, tuple[str, list[tuple[str, int]]]] = {  # (piece, times), written in turn
        "check-trace a bad log": ("check-trace", [(line, mb * 1024), ("{\n", 1)]),
        "check-trace escaped quotes 60 KB": ("check-trace", [('{"a":"', 1), ('\\"', 30_000)]),
        "check-trace 2 MB of brackets": ("check-trace", [("[", 2 << 20)]),
        "replay escaped quotes 64 KB": ("replay", [('{"config":"', 1), ('\\"', 32_768)]),
        "replay 60 MB of one string": ("replay", [('{"config":"', 1), ("x", 60 << 20), ('"}', 1)]),
        "replay 60 MB of brackets": ("replay", [("[", 60 << 20)]),
        "replay brackets at the cap": ("replay", [("[", cap)]),
        "replay pairs at the cap": ("replay", [("[]", cap // 2)]),
    }
    for k, (name, (cmd, pieces)) in enumerate(big.items()):
        p = d / f"big{k}"
        with open(p, "w") as f:
            for piece, times in pieces:
                for n in range(0, times, 1 << 16):  # never the whole file in memory here
                    f.write(piece * min(1 << 16, times - n))
        yield f"process {name}", lambda c=cmd, p=str(p): process([c, p], 2)
    junk = b'{"action":"PrefillAdm'  # a torn line, then the writer is gone
    for cmd in ("check-trace", "replay"):
        fifo = d / f"{cmd}.fifo"
        os.mkfifo(fifo)
        yield (
            f"process {cmd} a FIFO, junk, writer left",
            lambda c=cmd, f=fifo: process([c, str(f)], 2, feed=junk),
        )


# ------------------------------------------------------------------ the run
def counterexample(d: Path) -> str:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        kvown(["check", "--mutant", "free_on_cancel_in_flight", "--cex-dir", str(d)])
    return sorted(d.glob("*.json"))[0].read_text()


def user_files(d: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(d)): fingerprint(p) for p in sorted(d.rglob("*")) if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about a fifth of the cases")
    ap.add_argument("--only", help="a comma-separated list of the surfaces to run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory(prefix="kvown-hostile-") as tmp:
        t = Path(tmp)
        home = t / "user"  # the user's folder: the CLI runs from it
        home.mkdir()
        for name in ("notes.jsonl", "merged.jsonl", "cex.json", "run-1/p0.jsonl"):
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            (home / name).write_text(f"{name}: the user's own\n")
        before = user_files(home)
        for sub in ("logs", "cex", "disk", "cli", "cexgen", "procs", "cluster", "runs"):
            (t / sub).mkdir()
        only = set(args.only.split(",")) if args.only else None
        want = only is None or "replay" in only
        cex = counterexample(t / "cexgen") if want else ""
        surfaces: dict[str, Iterator[tuple[str, Callable[[], Outcome]]]] = {
            "check-trace": trace_cases(t / "logs", args.quick),
            "replay": replay_cases(t / "cex", cex) if want else iter(()),
            "manifest": manifest_cases(args.quick),
            "frame": frame_cases(),
            "disk": disk_cases(t / "disk", args.quick),
            "cli": misuse_cases(t / "cli"),
            "process": process_cases(t / "procs", args.quick),
            "cluster": cluster_cases.option_cases(cli, t / "cluster"),
            "cluster-runs": cluster_cases.process_cases(t / "runs", args.quick),
        }
        if only is not None:
            if only - set(surfaces):
                ap.error(f"--only: no surface {sorted(only - set(surfaces))}")
            surfaces = {k: v for k, v in surfaces.items() if k in only}
        cwd = os.getcwd()
        os.chdir(home)
        rows, bad = [], []
        try:
            for surface, gen in surfaces.items():
                c: Counter[str] = Counter()
                t0 = time.monotonic()
                for name, fn in gen:
                    kind, detail = run_case(fn, 300 if surface == "cluster-runs" else TIMEOUT_S)
                    c[kind] += 1
                    if kind != "ok":
                        bad.append(f"{surface}: {name}: {kind} {detail}")
                rows.append((surface, sum(c.values()), c, time.monotonic() - t0))
        finally:
            os.chdir(cwd)
        touched = sorted(k for k, v in user_files(home).items() if before.get(k) != v)
        touched += sorted(set(before) - set(user_files(home)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cols = ("cases", "hang", "traceback", "wrong", "held", "touched", "s")
    print(f"{'surface':12s}" + "".join(f"{h:>10s}" for h in cols))
    for surface, n, c, secs in rows:
        vals = [n, c["hang"], c["traceback"], c["wrong"], c["held"], c["touched"]]
        print(f"{surface:12s}" + "".join(f"{v:>10d}" for v in vals) + f"{secs:>10.1f}")
    total = sum(r[1] for r in rows)
    print(f"total cases {total}; user files touched: {len(touched)} {touched[:5]}")
    grown = (peak - base_rss) / 1024
    print(f"this process: {base_rss / 1024:.0f} MB after imports, peak {peak / 1024:.0f} MB"
          f" ({grown:.0f} MB grown by the in-process cases)")  # fmt: skip
    over = [(kb, c) for kb, c in RSS_KB if kb > 256 << 10 or kb < 0]
    top = max(RSS_KB, default=(0, ""))
    print(f"kvown processes: {len(RSS_KB)}, peak RSS {top[0] / 1024:.0f} MB ({top[1]}),"
          f" {len(over)} over 256 MB or unmeasured")  # fmt: skip
    bad += [f"process over 256 MB: {c} {kb} KB" for kb, c in over]
    if cluster_cases.STARTUP:
        print(f"cluster signals before kvown's handlers (Python's own): {cluster_cases.STARTUP}")
    for line in bad[:40]:
        print("  " + line[:220])
    if len(bad) > 40:
        print(f"  ... {len(bad) - 40} more")
    sys.exit(1 if bad or touched else 0)


if __name__ == "__main__":
    main()
