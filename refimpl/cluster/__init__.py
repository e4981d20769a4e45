"""A prefill/decode cluster of separate processes on torch.distributed (``kvown cluster``).

One router (the calling process), one process per prefill TP rank and a decode worker.
KV bytes go point to point over torch.distributed (gloo on loopback or across hosts: the
processes join through a TCP init method); control messages (Handoff manifest, Ready,
RankDone, Ack, Nack, cancel) go through the router's TCPStore, so a dead peer never hangs
anyone; every wait is bounded. The protocol is the refimpl's: freeze with pins, a JSON
manifest with per-block xxh3, epochs that fence stale attempts, commit then Ack then
release (``kvpath`` is the seam onto ``refimpl.chunks``/``blocks``/``checksum``/
``reshard``).

Files, one idea each: ``router`` (workload, faults, dead peers, outcomes, the checks at
the end), ``worker`` (the process entry and what both roles share), ``prefill`` and
``decode`` (the two roles), ``kvpath`` (the KV data path), ``control`` (the TCPStore
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
