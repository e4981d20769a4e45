"""A prefill/decode cluster of separate processes on torch.distributed (``kvown cluster``).

One router (the calling process), one process per prefill TP rank and one per decode
rank of each decode worker. Each prefill rank is a ``refimpl.api.ranks`` ``RankSender``
and each decode rank a ``RankReceiver`` of its own heads: the handoff (manifest gate,
reservation, per-chunk checksums, seals, commit, Ack/Nack, epochs that fence stale
attempts, the ranks' agreement) is the public API's, the one receive path. Its messages
ride ``link.Link``, an API ``Transport`` over the cluster's two planes: KV bytes point
to point over torch.distributed (gloo pair groups), headers and the workers' control
messages over the same pair groups (``pairs.Frames``) where a pair exists, else (the router,
prefill rank to prefill rank, decode rank to decode rank) through the router's
TCPStore, so a dead peer never hangs anyone; every wait is bounded.

Files, one idea each: ``router`` (workload, faults, dead peers, outcomes, the checks at
the end), ``worker`` (the process entry and what both roles share), ``prefill`` and
``decode`` (the two roles), ``ends`` (their RankSender and RankReceiver, decoding over a
decode worker's ranks), ``link`` (the API transport over both planes), ``pairs`` (the
pair groups, control frames over them), ``control`` (the TCPStore channel, delays and
drops, heartbeats), ``eventlog`` (per-process JSONL with Lamport clocks, the causal
merge, per-request conformance), ``faults`` (kill specs, cancels), ``workload`` (prompts
with a shared prefix, the reference decode, ``ClusterConfig``), ``procs`` (processes by
pid; a start judged by its pid: dead, hung or slow), ``report`` (the summary and
``--json``).
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
