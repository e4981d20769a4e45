"""A prefill/decode cluster of separate processes on torch.distributed (``kvown cluster``).

One router (the calling process), one process per prefill TP rank and a decode worker.
Each prefill rank is a ``refimpl.api`` ``Sender(..., rank=r)`` and each decode worker a
``Receiver``: the handoff (manifest gate, reservation, per-chunk checksums, seals, commit,
Ack/Nack, epochs that fence stale attempts) is the public API's, the one receive path.
Its messages ride ``link.Link``, an API ``Transport`` over the cluster's two planes: KV
bytes point to point over torch.distributed (gloo pair groups), headers and the
cluster's own control messages (admit, handoff, go, cancel, drop) through the router's
TCPStore, so a dead peer never hangs anyone; every wait is bounded.

Files, one idea each: ``router`` (workload, faults, dead peers, outcomes, the checks at
the end), ``worker`` (the process entry and what both roles share), ``prefill`` and
``decode`` (the two roles), ``ends`` (their Sender and Receiver), ``link`` (the API
transport over both planes), ``control`` (the TCPStore
channel, delays and drops, heartbeats), ``eventlog`` (per-process JSONL with Lamport
clocks, the causal merge, per-request conformance), ``faults`` (kill specs, cancels),
``workload`` (prompts with a shared prefix, the reference decode), ``procs`` (processes
by pid), ``report`` (the summary and ``--json``).
"""

from refimpl.cluster.faults import Kill, parse_kill
from refimpl.cluster.report import ClusterReport
from refimpl.cluster.router import CLUSTER_MUTANTS, ClusterConfig, run_cluster
from refimpl.cluster.workload import ModelSpec, Request, make_requests, reference_tokens

__all__ = [
    "CLUSTER_MUTANTS",
    "ClusterConfig",
    "ClusterReport",
    "Kill",
    "ModelSpec",
    "Request",
    "make_requests",
    "parse_kill",
    "reference_tokens",
    "run_cluster",
]
