"""``kvown cluster``: a prefill/decode cluster of separate processes on torch.distributed.

Starts the router (this process), one process per prefill TP rank and one per decode
worker; KV bytes go point to point over gloo (one process group per prefill rank and
decode worker pair and incarnation), control messages through a TCPStore. Runs a
workload of real requests on the tiny model with kills (a killed worker restarts as a
new incarnation), control delays and drops, and cancels; then checks that every request
ended with a reason, that no live worker holds a block, that finished tokens equal a
single-process reference decode, and that the merged event log conforms to the spec
(request by request). Library code lives in ``refimpl/cluster``; this module only
parses, shows progress and prints.

Exit codes: 0 the run is clean; 1 something failed (a request lost, a leak, tokens
differ, a worker crashed or did not start, or the merged log is flagged: a ``--mutant``
run exits 1 with ``conforms: false``); 2 misuse (one ``error:`` line; with ``--json``
also ``{"error"}``); 130 interrupted: Ctrl-C, SIGTERM or SIGHUP (one line, every worker ended).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from kvown_cli.usage import MAX_SEED, UsageError, int_in, one_line, positive_seconds
from spec.strict_json import short

if TYPE_CHECKING:
    from refimpl.cluster.report import ClusterReport

HELP = "run a prefill/decode cluster of processes (torch.distributed) and check it"


def probability(text: str) -> float:
    """An argparse type: a finite probability in [0, 1]."""
    try:
        v = float(text) if len(text) <= 32 else math.nan
    except ValueError:
        v = math.nan
    if not 0.0 <= v <= 1.0:  # nan fails both
        raise argparse.ArgumentTypeError(f"{short(text)} is not a probability in [0, 1]")
    return v


def millis(text: str) -> float:
    """An argparse type: a finite delay in [0, 10000] ms."""
    try:
        v = float(text) if len(text) <= 32 else math.nan
    except ValueError:
        v = math.nan
    if not 0.0 <= v <= 10_000.0:
        raise argparse.ArgumentTypeError(f"{short(text)} is not a delay in [0, 10000] ms")
    return v


def timeout_seconds(text: str) -> float:
    v = positive_seconds(text)
    if v > 600:
        raise argparse.ArgumentTypeError(f"{v} s: a dead-peer timeout is at most 600 s")
    return v


def _mutant_help() -> str:
    from refimpl.cluster.router import CLUSTER_MUTANTS
    from spec.mutants import MUTANTS

    named = ", ".join(f"{m} ({MUTANTS[m].expected})" for m in CLUSTER_MUTANTS)
    return (
        f"switch a named mutant on in the workers; the ones with a cluster switch (and the "
        f"spec property each breaks): {named}; the other {len(MUTANTS) - len(CLUSTER_MUTANTS)}"
        " spec mutants have no cluster switch (default: none)"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int_in(1, 100_000), default=20, help="requests")
    p.add_argument("--prefill-tp", type=int_in(1, 4), default=2, help="prefill TP ranks")
    p.add_argument(
        "--decode-tp",
        type=int_in(1, 8),
        default=1,
        help="decode TP ranks per decode worker (each a process)",
    )
    p.add_argument("--decode-workers", type=int_in(1, 4), default=1, help="decode workers")
    p.add_argument(
        "--kill", help="random | prefill:RANK@P%% | decode[:N[.R]]@P%% (SIGKILL; default: none)"
    )
    p.add_argument(
        "--restarts", type=int_in(0, 8), default=2,
        help="restarts of killed workers, in all (a restarted worker is a new incarnation)",
    )  # fmt: skip
    p.add_argument(
        "--retries", type=int_in(0, 4), default=2,
        help="new attempts of a request whose attempt failed (a crash, a timeout, a refusal)",
    )  # fmt: skip
    p.add_argument("--cancel", type=probability, default=0.05, help="P(a request is cancelled)")
    p.add_argument("--delay", type=probability, default=0.05, help="P(a control msg is delayed)")
    p.add_argument("--delay-ms", type=millis, default=20.0, help="how long a delay lasts")
    p.add_argument("--drop", type=probability, default=0.02, help="P(a Ready is dropped)")
    p.add_argument("--timeout", type=timeout_seconds, default=3.0, help="dead-peer timeout (s)")
    p.add_argument("--deadline", type=positive_seconds, default=600.0, help="the run's bound (s)")
    p.add_argument("--mutant", help=_mutant_help())
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0, help="the run's seed")
    p.add_argument("--steps", type=int_in(0, 256), default=4, help="decode steps per request")
    p.add_argument("--max-inflight", type=int_in(1, 64), default=4, help="requests at once")
    p.add_argument("--layers", type=int_in(1, 8), default=2, help="layers of the tiny model")
    p.add_argument("--kv-heads", type=int_in(1, 8), default=2, help="KV heads (query: 4x)")
    p.add_argument("--head-dim", type=int_in(8, 128), default=8, help="head dimension")
    p.add_argument("--block-size", type=int_in(1, 64), default=8, help="tokens per KV block")
    p.add_argument("--no-raw", action="store_true", help="skip the raw send/recv baseline")
    p.add_argument(
        "--log-dir",
        help="event logs go here; a folder with files in it gets a new run-<n> folder inside"
        " (default: a new temporary folder)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _config(a: argparse.Namespace) -> Any:
    from refimpl.cluster.router import ClusterConfig
    from refimpl.cluster.workload import ModelSpec

    try:
        model = ModelSpec(
            layers=a.layers, q_heads=4 * a.kv_heads, kv_heads=a.kv_heads,
            head_dim=a.head_dim, block_size=a.block_size,
        )  # fmt: skip
        return ClusterConfig(
            requests=a.requests, prefill_tp=a.prefill_tp, decode_tp=a.decode_tp,
            decode_workers=a.decode_workers, seed=a.seed, kill=a.kill, restarts=a.restarts,
            retries=a.retries,
            cancel_p=a.cancel, delay_p=a.delay, delay_s=a.delay_ms / 1000, drop_p=a.drop,
            timeout_s=a.timeout, deadline_s=a.deadline, mutant=a.mutant, model=model,
            steps=a.steps, max_inflight=a.max_inflight, raw_baseline=not a.no_raw,
            log_dir=a.log_dir or "",
        )  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None


def _log_dir(path: str) -> None:
    """Refuse a --log-dir that cannot hold the logs, before any process starts."""
    if not path.strip() or "\0" in path:
        raise UsageError("--log-dir: empty or invalid path")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"--log-dir: {short(path)} is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--log-dir: cannot create {short(path)}: {e.strerror or e}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"--log-dir: {short(path)} is not writable")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run as Ctrl-C does (the router's ``finally`` ends every
    worker by its pid; ``main`` prints one line with what was done, exit 130). The first
    one interrupts; later ones are ignored, so they cannot cut that cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGTERM, signal.SIGHUP)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        from model_checks import children

        for s in sigs:
            signal.signal(s, signal.SIG_IGN)
        if children.defer_interrupt():  # a worker is starting: popen raises once it is known
            return
        raise KeyboardInterrupt

    old = {s: signal.signal(s, interrupt) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _fmt(x: object, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, float) else str(x)


def run(args: argparse.Namespace) -> int:
    if args.log_dir is not None:
        _log_dir(args.log_dir)
    cfg = _config(args)
    from kvown_cli.progress import Progress, console
    from refimpl.cluster.procs import WorkerStartError
    from refimpl.cluster.router import run_cluster

    with Progress("cluster", cfg.requests, "requests") as bar:
        serving: list[bool] = []

        def progress(done: int, total: int, counts: dict[str, int]) -> None:
            if not serving:  # the workers are up: the rate is the requests' from here
                serving.append(True)
                bar.start_work()
            line = " ".join(f"{k}={v}" for k, v in counts.items() if k != "lost")
            bar.update(done, note=line)

        with _terminate_as_interrupt():
            try:
                rep: ClusterReport | None = run_cluster(cfg, progress)
            except WorkerStartError as e:  # a worker died or hung at its start: a failure
                rep, failed = None, str(e)
    if rep is None:
        print(f"error: kvown cluster: {one_line(failed)}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": one_line(failed)}))
        return 1
    j = rep.to_json()
    if args.json:
        print(json.dumps(j))
        return 0 if rep.ok else 1
    from rich.table import Table

    t = Table(title=f"kvown cluster: {cfg.requests} requests, prefill TP={cfg.prefill_tp} -> "
              f"{cfg.decode_workers} decode worker(s), {rep.backend}")  # fmt: skip
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("requests/s", _fmt(j["requests_per_s"])),
        ("handoff GiB/s", _fmt(j["handoff_gib_s"])),
        ("raw send/recv GiB/s", _fmt(j["raw_gib_s"]) + (f" ({j['raw_skipped']})"
                                                       if j["raw_skipped"] else "")),
        ("handoff_over_raw", _fmt(j["handoff_over_raw"])),
        ("handoff p50 / p99 ms", f"{_fmt(j['p50_ms'])} / {_fmt(j['p99_ms'])}"),
        ("faults injected", ", ".join(f"{k}={v}" for k, v in sorted(j["faults"].items()))),
        ("killed / restarted", f"{', '.join(j['killed']) or '-'} / "
                               f"{', '.join(j['restarted']) or '-'}"),
        ("outcomes", ", ".join(f"{k}={v}" for k, v in j["requests"].items())),
        ("retried (new attempts)", str(j["retried"])),
        ("leaked blocks", str(j["leaked_blocks"])),
        ("tokens = reference", str(j["tokens_match_reference"])),
        ("merged log conforms", f"{j['conforms']} ({j['checked_requests']} request logs)"),
        ("logs", j["log_dir"]),
    ]  # fmt: skip
    if j["mutant"]:
        mu = j["mutant"]
        rows.append(("mutant", f"{mu['name']}: expects {mu['expected']}, caught={mu['caught']}"))
    for row in rows:
        t.add_row(*row)
    out = console()
    out.print(t)
    for reason, n in j["reason_counts"].items():
        out.print(f"{n:5d} x {reason}")
    for v in j["violations"]:
        out.print(
            f"[red]flagged[/red] {v['rid']} line {v['line']}: {v['violated'] or 'not allowed'}"
            f" ({v['reason']}); kvown check-trace {v['log']}"
        )
    if j["violations_total"] > len(j["violations"]):
        out.print(f"... {j['violations_total']} flagged request logs in all")
    for err in j["integrity_errors"]:
        out.print(f"[red]integrity[/red] {err}")
    return 0 if rep.ok else 1
