"""``kvown cluster``: a prefill/decode cluster of separate processes on torch.distributed.

Starts the router (this process), one process per prefill TP rank and a decode worker;
KV bytes go point to point over gloo, control messages through a TCPStore. Runs a
workload of real requests on the tiny model with kills, control delays and drops, and
cancels; then checks that every request ended with a reason, that no live worker holds
a block, that finished tokens equal a single-process reference decode, and that the
merged event log conforms to the spec (request by request). Library code lives in
``refimpl/cluster``; this module only parses, shows progress and prints.

Exit codes: 0 the run is clean; 1 something failed (a request lost, a leak, tokens
differ, a worker crashed, or the merged log is flagged: a ``--mutant`` run exits 1 with
``conforms: false``); 2 misuse.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

HELP = "run a prefill/decode cluster of processes (torch.distributed) and check it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=20, help="requests in the workload")
    p.add_argument("--prefill-tp", type=int, default=2, help="prefill TP ranks (processes)")
    p.add_argument("--decode-tp", type=int, default=1, help="decode TP ranks (only 1)")
    p.add_argument(
        "--kill", help="random | prefill:RANK@P%% | decode@P%% (SIGKILL a worker; default: none)"
    )
    p.add_argument("--cancel", type=float, default=0.05, help="probability a request is cancelled")
    p.add_argument("--delay", type=float, default=0.05, help="probability a control msg is delayed")
    p.add_argument("--delay-ms", type=float, default=20.0, help="how long a delay lasts")
    p.add_argument("--drop", type=float, default=0.02, help="probability a Ready is dropped")
    p.add_argument("--timeout", type=float, default=3.0, help="dead-peer / transfer timeout (s)")
    p.add_argument("--deadline", type=float, default=600.0, help="the whole run's bound (s)")
    p.add_argument("--mutant", help="switch a refimpl mutant on in the workers (default: none)")
    p.add_argument("--seed", type=int, default=0, help="the workload's and the faults' seed")
    p.add_argument("--steps", type=int, default=4, help="decode steps per request")
    p.add_argument("--max-inflight", type=int, default=4, help="requests admitted at once")
    p.add_argument("--layers", type=int, default=2, help="layers of the tiny model")
    p.add_argument("--kv-heads", type=int, default=2, help="KV heads (query heads: 4x)")
    p.add_argument("--head-dim", type=int, default=8, help="head dimension")
    p.add_argument("--block-size", type=int, default=8, help="tokens per KV block")
    p.add_argument("--no-raw", action="store_true", help="skip the raw send/recv baseline")
    p.add_argument("--log-dir", default="kvown-cluster-logs", help="event logs go here")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _config(a: argparse.Namespace) -> Any:
    from refimpl.cluster.router import ClusterConfig
    from refimpl.cluster.workload import ModelSpec

    model = ModelSpec(
        layers=a.layers,
        q_heads=4 * a.kv_heads,
        kv_heads=a.kv_heads,
        head_dim=a.head_dim,
        block_size=a.block_size,
    )
    return ClusterConfig(
        requests=a.requests,
        prefill_tp=a.prefill_tp,
        decode_tp=a.decode_tp,
        seed=a.seed,
        kill=a.kill,
        cancel_p=a.cancel,
        delay_p=a.delay,
        delay_s=a.delay_ms / 1000,
        drop_p=a.drop,
        timeout_s=a.timeout,
        deadline_s=a.deadline,
        mutant=a.mutant,
        model=model,
        steps=a.steps,
        max_inflight=a.max_inflight,
        raw_baseline=not a.no_raw,
        log_dir=a.log_dir,
    )


def _fmt(x: object, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, float) else str(x)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = _config(args)
    except ValueError as e:
        print(f"kvown cluster: {e}", file=sys.stderr)
        return 2
    from rich.table import Table

    from kvown_cli.progress import Progress, console
    from refimpl.cluster.router import run_cluster

    with Progress("cluster", cfg.requests, "requests") as bar:

        def progress(done: int, total: int, counts: dict[str, int]) -> None:
            line = " ".join(f"{k}={v}" for k, v in counts.items() if k != "lost")
            bar.update(done, note=line)

        rep = run_cluster(cfg, progress)
    if args.json:
        print(json.dumps(rep.to_json()))
        return 0 if rep.ok else 1
    j = rep.to_json()
    t = Table(title=f"kvown cluster: {cfg.requests} requests, prefill TP={cfg.prefill_tp} -> "
              f"decode TP={cfg.decode_tp}, {rep.backend}")  # fmt: skip
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("requests/s", _fmt(j["requests_per_s"])),
        ("handoff GiB/s", _fmt(j["handoff_gib_s"])),
        ("raw send/recv GiB/s", _fmt(j["raw_gib_s"])),
        ("handoff_over_raw", _fmt(j["handoff_over_raw"])),
        ("handoff p50 / p99 ms", f"{_fmt(j['p50_ms'])} / {_fmt(j['p99_ms'])}"),
        ("faults injected", ", ".join(f"{k}={v}" for k, v in sorted(j["faults"].items()))),
        ("killed", ", ".join(j["killed"]) or "-"),
        ("outcomes", ", ".join(f"{k}={v}" for k, v in j["requests"].items())),
        ("leaked blocks", str(j["leaked_blocks"])),
        ("tokens = reference", str(j["tokens_match_reference"])),
        ("merged log conforms", f"{j['conforms']} ({j['checked_requests']} request logs)"),
        ("logs", j["log_dir"]),
    ]
    for row in rows:
        t.add_row(*row)
    out = console()
    out.print(t)
    for v in j["violations"]:
        out.print(
            f"[red]flagged[/red] {v['rid']} line {v['line']}: {v['violated'] or 'not allowed'}"
            f" ({v['reason']}); kvown check-trace {v['log']}"
        )
    for err in j["integrity_errors"]:
        out.print(f"[red]integrity[/red] {err}")
    return 0 if rep.ok else 1
