"""Start-up, exit and worker-hello times of two checkouts, side by side (issue #35).

    python benchmarks/cli/start_exit.py BEFORE_ROOT [AFTER_ROOT] [--runs N]

For each checkout (AFTER_ROOT: this one by default), interleaved run by run so both see
the same load:

- ``fuzz --seconds 5``: the time to its last line of output, and from that line to the
  process's exit (the interpreter's teardown, before ``kvown_cli.interrupt.lifetime``);
- ``list``: the whole command (start-up and imports of a command without torch);
- ``cluster --requests 2``: each worker's spawn to its hello (the router's start is
  replaced by a probe that starts the workers the same way and only times the hellos),
  and the whole command.

Prints one JSON line per run and a table of medians. Timings only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HELLO_PROBE = """
import sys, time
from refimpl.cluster import router as R
def start(self):
    t0 = time.monotonic()
    for w in self.workers:
        self.procs.start(self.worker_args(w, self.inc))
    got = {}
    while len(got) < len(self.workers) and time.monotonic() - t0 < 600:
        for m in self.ch.poll():
            if m["kind"] == "hello":
                got[m["src"]] = time.monotonic() - t0
            else:
                self.backlog.append(m)
        time.sleep(0.01)
    print("HELLO " + repr(max(got.values())), file=sys.stderr, flush=True)
R.Router.start = start
from kvown_cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _timed(root: Path, argv: list[str]) -> tuple[float, float, str]:
    """(seconds to the last output byte, seconds to the exit, stderr+stdout text)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=root, env=env
    )
    assert p.stdout is not None
    last, out = t0, b""
    while chunk := os.read(p.stdout.fileno(), 65536):
        out += chunk
        last = time.monotonic()
    p.wait()
    return last - t0, time.monotonic() - t0, out.decode(errors="replace")


def one_run(root: Path) -> dict[str, float]:
    out_s, exit_s, _ = _timed(root, ["-m", "kvown_cli.main", "fuzz", "--seconds", "5"])
    _, list_s, _ = _timed(root, ["-m", "kvown_cli.main", "list"])
    _, cluster_s, text = _timed(root, ["-c", HELLO_PROBE, "cluster", "--requests", "2"])
    hello = next(float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("HELLO "))
    return {
        "fuzz5_output_s": out_s,
        "fuzz5_exit_after_output_s": exit_s - out_s,
        "list_s": list_s,
        "cluster_last_hello_s": hello,
        "cluster2_s": cluster_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path, nargs="?", default=Path(__file__).resolve().parents[2])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for k in range(a.runs):
        for name, root in (("before", a.before), ("after", a.after)):
            r = one_run(root)
            runs[name].append(r)
            print(json.dumps({"run": k, "tree": name, "load": os.getloadavg()[0], **r}), flush=True)
    print(f"{'median':28s} {'before':>8s} {'after':>8s}")
    for key in runs["before"][0]:
        b = statistics.median(r[key] for r in runs["before"])
        f = statistics.median(r[key] for r in runs["after"])
        print(f"{key:28s} {b:8.2f} {f:8.2f}")


if __name__ == "__main__":
    main()
