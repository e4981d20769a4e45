"""Time and peak memory per MB of the readers of untrusted JSON and of the conformance
checker, on ordinary and hostile inputs side by side (issue #34).

    python benchmarks/hostile_readers.py [--mb 1.0]

Each row is one input of about ``--mb`` MB: seconds per MB (best of 3, no tracing) and
peak traced bytes per input byte (``tracemalloc``, one more run). The readers are
``spec.strict_json.loads_strict`` under each caller's limits (a handoff manifest, a disk
tier header, a saved counterexample) and, end to end, ``refimpl.tiers.files.read_header``
and the conformance checker (``check_text``: the event-log reader and the checker; and
``check_file`` on a log file, which streams a log naming its config and reads one
declaring its world twice, keeping neither). The
hostile inputs are those of the issue: a run of escaped quotes, unbalanced brackets, a
megabyte of empty pairs, junk metadata keys, a fresh clock on every line. The row
``before #34`` is the old depth pre-scan (a backtracking regex) on 32 KB only: it is
quadratic, and a megabyte would take hours.

    python benchmarks/hostile_readers.py --rss-mb 100 [--root DIR]

prints instead ``kvown check-trace``'s peak resident memory (the whole process) on
logs of about 100 MB that declare their world (``rss_table``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.trace_check_bench import generate  # noqa: E402
from model_checks.conformance import LogError, check_file, check_text  # noqa: E402
from refimpl.tiers import files  # noqa: E402
from spec.manifest_fields import MAX_INT_DIGITS, MAX_JSON_CHARS, MAX_JSON_DEPTH  # noqa: E402
from spec.strict_json import StrictJSONError, loads_strict  # noqa: E402

LIMITS = {
    "manifest": {
        "max_bytes": MAX_JSON_CHARS,
        "max_depth": MAX_JSON_DEPTH,
        "max_int_digits": MAX_INT_DIGITS,
    },
    "counterexample": {"max_bytes": 64 << 20, "max_depth": 32, "max_int_digits": 32},
}


def _escaped_quotes(n: int) -> str:
    return '{"a": "' + '\\"' * (n // 2)


def _empty_pairs(n: int) -> str:
    return '{"a": [' + "[]," * (n // 3) + "[]]}"


def _manifest(n: int) -> str:
    tokens = list(range(n // 8))
    return json.dumps({"request_id": "r", "token_ids": tokens, "num_tokens": len(tokens)})


def _cex(n: int) -> str:
    step = {"action": "PrefillSendChunk", "args": {"req": 0}}
    k = n // len(json.dumps(step))
    return json.dumps({"config": "handoff_two", "violated": "X", "trace": [step] * k}, indent=1)


def _header_file(meta: dict[str, str]) -> io.BytesIO:
    head = json.dumps(
        {"__metadata__": meta, "kv": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}
    )
    raw = head.encode() + b" " * (-(8 + len(head)) % 8)
    f = io.BytesIO(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    f.fileno = lambda: _FD  # type: ignore[method-assign]
    return f


_FD = -1


def _read_header(f: io.BytesIO) -> object:
    size = len(f.getbuffer())
    real = files.os.fstat
    files.os.fstat = lambda fd: type("S", (), {"st_size": size})()  # type: ignore[assignment]
    try:
        return files.read_header(f)
    finally:
        files.os.fstat = real


def _log_notes(n: int) -> str:
    """A conforming log whose lines carry 60 KB notes of escaped quotes (ignored fields)."""
    note = '\\"' * 30_000
    lines = generate(40).splitlines()
    out, size = [lines[0]], 0
    for ln in lines[1:]:
        out.append(ln[:-1] + ', "note": "' + note + '"}' if size < n else ln)
        size += len(out[-1])
    return "\n".join(out) + "\n"


def _log_fresh_clocks(n: int) -> str:
    head = (
        '{"config": "handoff_two", "timeout_s": 30}\n'
        + '{"action": "PrefillAdmit", "args": {"req": 0}, "t": 0}\n'
    )
    k = n // 70
    now = '{{"action": "Now", "args": {{"worker": "decode"}}, "t": {t}, "clock": "c{i}"}}'
    return head + "\n".join(now.format(t=round(1e6 - i * 0.5, 3), i=i) for i in range(k)) + "\n"


def _copies_then_begins(n: int) -> str:
    """A declared world's log (read ahead for its sizes, ``sizing.prescan``): one offload
    copy of each of many requests, then each request's offload begin (the read-ahead was
    quadratic in the requests here before 2026-12-03)."""
    k = min(n // 140, 60_000)  # request ids stay in the read-ahead's range
    copy = '{{"action": "PrefillOffloadCopy", "args": {{"req": {r}}}}}'
    begin = '{{"action": "PrefillOffloadBegin", "args": {{"req": {r}}}}}'
    lines = [json.dumps({"format": "kvown-eventlog", "version": 1, "behaviours": []})]
    lines += [copy.format(r=r) for r in range(k)] + [begin.format(r=r) for r in range(k)]
    return "\n".join(lines) + "\n"


def _log_ordinary(n: int) -> str:
    return generate(max(40, n // 50))


def _strict(kind: str, text: str, **extra: int) -> Callable[[], object]:
    return lambda: loads_strict(text, **{**LIMITS[kind], **extra})  # type: ignore[arg-type]


def cases(n: int) -> list[tuple[str, str, int, Callable[[], object]]]:
    """(reader, input, its size in bytes, the call)."""
    junk = {f"k{i}": "" for i in range(n // 10)}
    tier_ok = _header_file({"kvown.format": "kvown-disk-kv/1", "kvown.manifest": _manifest(n)})
    tier_junk = _header_file(junk)
    out: list[tuple[str, str, int, Callable[[], object]]] = []
    for kind, ordinary in (("manifest", _manifest(n)), ("counterexample", _cex(n))):
        out.append((kind, "ordinary", len(ordinary), _strict(kind, ordinary)))
        for name, text in (
            ("escaped quotes", _escaped_quotes(n)),
            ("empty pairs", _empty_pairs(n)),
            ("unbalanced [", "[" * n),
        ):
            out.append((kind, name, len(text), _strict(kind, text)))
    tier_long = _header_file({"kvown.format": "kvown-disk-kv/1", "m": "x" * n})
    for name, f in (
        ("ordinary", tier_ok),
        (f"{len(junk):,} junk keys", tier_junk),
        ("one long metadata value", tier_long),
    ):
        out.append(("tier header", name, len(f.getbuffer()), lambda f=f: _read_header(f)))
    for name, log in (
        ("ordinary", _log_ordinary(n)),
        ("60 KB notes of escaped quotes", _log_notes(n)),
        ("a fresh clock on each line", _log_fresh_clocks(n)),
    ):
        out.append(("check-trace", name, len(log), lambda log=log: check_text(log)))
    # From a file (``check_file``, what ``kvown check-trace FILE`` runs): a log naming its
    # config streams (two chunks); a log declaring its world is read twice (its sizes
    # come from the whole log), in bounded memory as well.
    ordinary = _log_ordinary(n)
    declared = '{"format": "kvown-eventlog", "version": 1, "behaviours": [], "faults": []}'
    for name, log in (
        ("file, config named (streamed)", ordinary),
        ("file, world declared (read twice)", declared + ordinary[ordinary.index("\n") :]),
        ("file, world declared, a copy per request then its begin", _copies_then_begins(n)),
    ):
        path = _tmp_log(log)
        out.append(("check-trace", name, len(log), lambda path=path: check_file(path)))
    return out


def _tmp_log(text: str) -> str:
    f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)  # noqa: SIM115
    with f:
        f.write(text)
    _TEMP.append(f.name)
    return f.name


_TEMP: list[str] = []  # the logs written for check_file, removed at the end


def _old_prescan(text: str) -> None:
    for _ in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text, re.DOTALL):
        pass


def measure(fn: Callable[[], object]) -> tuple[float, int, str]:
    def once() -> str:
        try:
            fn()
        except (StrictJSONError, LogError, files.TornFileError) as exc:
            return f"refused: {str(exc)[:50]}"
        return "read"

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        what = once()
        best = min(best, time.perf_counter() - t0)
    tracemalloc.start()
    once()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, peak, what


DECLARED = json.dumps({"format": "kvown-eventlog", "version": 1, "behaviours": [], "faults": []})


def _ordinary(path: Path, n: int) -> None:
    body = generate(max(40, n // 45))
    with path.open("w") as f:
        f.write(DECLARED + body[body.index("\n") :])


def _padded(path: Path, n: int) -> None:
    body = generate(40)
    pad = " " * 49 + "\n"
    with path.open("w") as f:
        f.write(DECLARED + body[body.index("\n") :])
        block = pad * 20_000
        for _ in range(n // len(block)):
            f.write(block)


def _rss_run(root: Path, path: Path, pipe: bool) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MB of the checker's process alone, exit code, first line). The
    peak is GNU time's ``%M`` of the exec'd checker: a child forked from this (large)
    process would count this process's pages in its own ``ru_maxrss``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as d:
        rss = Path(d) / "rss"
        cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss), sys.executable, "-m"]
        cmd += ["kvown_cli.main", "check-trace", "/dev/stdin" if pipe else str(path)]
        t0 = time.perf_counter()
        if pipe:
            cat = subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE)
            p = subprocess.run(
                cmd, stdin=cat.stdout, env=env, cwd=root, capture_output=True, text=True
            )
            assert cat.stdout is not None
            cat.stdout.close()
            cat.wait()
        else:
            p = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        peak_kb = int(rss.read_text().split()[-1])
    lines = (p.stdout or p.stderr).strip().splitlines()
    return wall, peak_kb / 1024, p.returncode, lines[0][:60] if lines else ""


def rss_table(mb: float, root: Path) -> None:
    """Peak resident memory of ``kvown check-trace`` on logs of about ``mb`` MB that
    declare their world, each checked in its own process under GNU time (``--root``: the
    checkout whose code runs): an ordinary conforming log (two handoffs stretched by token
    steps), a few lines padded with whitespace-only lines, and that log from a pipe."""
    n = int(mb * (1 << 20))
    print("| log | MB | wall s | peak RSS MB | exit | first line |")
    print("|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as d:
        ordinary, padded = Path(d) / "ordinary.jsonl", Path(d) / "padded.jsonl"
        _ordinary(ordinary, n)
        _padded(padded, n)
        for label, path, pipe in (
            ("ordinary", ordinary, False),
            ("padded", padded, False),
            ("padded, from a pipe", padded, True),
        ):
            size = path.stat().st_size / (1 << 20)
            wall, peak, rc, line = _rss_run(root, path, pipe)
            print(f"| {label} | {size:.1f} | {wall:.1f} | {peak:.0f} | {rc} | {line} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0, help="size of each input, MB")
    ap.add_argument("--rss-mb", type=float, help="instead: check-trace's peak RSS, logs of MB")
    ap.add_argument("--root", type=Path, default=ROOT, help="with --rss-mb: the code run")
    args = ap.parse_args(argv)
    if args.rss_mb:
        rss_table(args.rss_mb, args.root)
        return 0
    n = int(args.mb * (1 << 20))
    print("| reader | input | MB | s/MB | peak bytes / input byte | outcome |")
    print("|---|---|---:|---:|---:|---|")
    for reader, name, size, fn in cases(n):
        s, peak, what = measure(fn)
        mb = size / (1 << 20)
        print(f"| {reader} | {name} | {mb:.2f} | {s / mb:.3f} | {peak / size:.1f} | {what} |")
    old = _escaped_quotes(32 << 10)
    s, peak, _ = measure(lambda: _old_prescan(old))
    mb = len(old) / (1 << 20)
    row = f"{mb:.3f} | {s / mb:.0f} | {peak / len(old):.1f} | (quadratic)"
    print(f"| before #34: depth pre-scan | escaped quotes | {row} |")
    for name in _TEMP:
        os.unlink(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
