"""Known-bug variants: each is the correct model with one guard removed or changed.

A mutant is switched on by name (``m`` in every action is a frozenset of names). Each
names the property it must break and the configs on which it must break it. The
length of its shortest counterexample is pinned in ``spec/pinned.json``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    expected: str  # the property ID it must violate
    configs: tuple[str, ...]  # where it must be caught
    seed_failure: str  # which failure of the seed / spec-outline / incident it is
    doc: str


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "release_before_install",
            "NothingLost",
            ("handoff_tp2to1",),
            "outline 1 (seed: source frees KV before target installs)",
            "PrefillRelease fires once everything is sent, without waiting for decode's Ack.",
        ),
        Mutant(
            "source_writes_while_frozen",
            "FrozenSnapshot",
            ("handoff_tp2to1",),
            "outline 2 (seed: source and target both keep writing)",
            "PrefillDecodeStep keeps appending to the frozen snapshot during the handoff.",
        ),
        Mutant(
            "source_resumes_on_timeout",
            "SingleWriter",
            ("handoff_tp2to1",),
            "outline 2 (two writers after a failed handoff)",
            "PrefillTimeout thaws the source for writing without decode's Nack.",
        ),
        Mutant(
            "partial_as_complete",
            "NoPartialUse",
            ("handoff_tp2to1",),
            "outline 3 (seed: partial transfer taken as complete); sglang #30233",
            "DecodeValidate trusts the RankDones and skips the landed-blocks/checksum check.",
        ),
        Mutant(
            "mismatch_installed",
            "ManifestGate",
            ("handoff_tp2to1",),
            "outline 4 (seed: position/adapter/quantization mismatch installed)",
            "DecodeValidate skips the manifest compatibility check.",
        ),
        Mutant(
            "cancel_ignored",
            "StickyEnd",
            ("handoff_tp2to1",),
            "outline 5 (seed: cancellation neither interrupts nor discards the transfer)",
            "Decode validates and commits a request the client has cancelled.",
        ),
        Mutant(
            "stale_epoch_accepted",
            "Fencing",
            ("handoff_tp2to1",),
            "outline 7 (late message from an aborted attempt accepted)",
            "DecodeReceiveDone counts a RankDone whatever its epoch.",
        ),
        Mutant(
            "error_overwritten",
            "StickyEnd",
            ("handoff_tp2to1",),
            "outline 8 (error status overwritten by a later success)",
            "DecodeCommit on a failed request commits and sets it running again.",
        ),
        Mutant(
            "free_on_cancel_in_flight",
            "NoReuseUnderIO",
            ("handoff_tp2to1",),
            "outline 9; vllm #32255 (abort frees blocks under an in-flight read)",
            "DecodeAbort frees the destination blocks at once instead of quarantining them.",
        ),
        Mutant(
            "duplicate_rank_counted",
            "RankAgreement",
            ("handoff_tp2to1",),
            "outline 10 (one rank's duplicate completion counted for a missing rank)",
            "DecodeValidate counts RankDone messages instead of distinct ranks.",
        ),
        Mutant(
            "zero_block_never_done",
            "FairTermination",
            ("prefix_share",),
            "outline 11 (full prefix hit: zero blocks to send, completion never reported)",
            "PrefillSendChunk with nothing to send skips the RankDones.",
        ),
        Mutant(
            "sweep_only_on_admit",
            "NoDeadlock",
            ("handoff_crash",),
            "outline 12 (timeout sweep runs only when new work is admitted)",
            "Timeouts fire only while some request can be admitted.",
        ),
        Mutant(
            "failed_store_visible",
            "PublishAfterCommit",
            ("offload_contend",),
            "outline 13; LMCache #4991 (a failed store stays visible to lookups)",
            "EnvStoreFail leaves the partial host copy published and frees the GPU copy.",
        ),
        Mutant(
            "reload_during_store",
            "LoadXorStore",
            ("offload_contend",),
            "outline 14 (reload starts while a store is in flight)",
            "PrefillReloadBegin accepts a host copy whose store has not committed.",
        ),
        Mutant(
            "evict_referenced_prefix",
            "CapacityRefcount",
            ("prefix_share",),
            "outline 15 (shared prefix block released while still referenced)",
            "DecodeEvictPrefix ignores the reference count.",
        ),
        Mutant(
            "preempt_during_store",
            "NoReuseUnderIO",
            ("offload_contend",),
            "vllm #29870 (a deferred store reads blocks that were already reused)",
            "PrefillPreempt frees GPU blocks that an in-flight store is still reading.",
        ),
        Mutant(
            "no_timeout_while_filling",
            "BoundedExit",
            ("handoff_tp2to1",),
            "sglang #31800 (no timeout in the Transferring state)",
            "DecodeTimeout fires only before the first chunk lands.",
        ),
        Mutant(
            "free_with_step_in_flight",
            "NoReuseUnderIO",
            ("async_handoff",),
            "async scheduling: abort/finish frees blocks an in-flight step still writes"
            " (vllm async scheduling, SGLang overlap scheduler)",
            "A finish, abort or quiesce frees the blocks while a dispatched step writes them.",
        ),
        Mutant(
            "freeze_with_step_in_flight",
            "FrozenSnapshot",
            ("async_handoff",),
            "async scheduling: the handoff snapshot is frozen while a dispatched step writes it",
            "PrefillFreeze freezes and sends the source while a dispatched step still writes it.",
        ),
        Mutant(
            "preempt_with_step_in_flight",
            "NoReuseUnderIO",
            ("async_handoff",),
            "async scheduling: a preemption frees blocks an in-flight step still writes",
            "PrefillPreempt drops the blocks while a dispatched step still writes them.",
        ),
        Mutant(
            "free_fenced_unrevocable",
            "NoReuseUnderIO",
            ("handoff_unrevocable",),
            "issue #21 item 2 (a write that cannot be revoked lands in freed blocks)",
            "On a transport with no revoke (revocable=False), DecodeTimeout frees the"
            " attempt's blocks as if its fence stopped the writes still in flight.",
        ),
        Mutant(
            "batch_status_subset",
            "NoReuseUnderIO",
            ("handoff_unrevocable",),
            "issue #21 item 2; Mooncake TENT #2055 (batch status from a subset of its tasks)",
            "The sender takes its write batch as finished from the status of its first task"
            " only, and frees its source and says Quiesced while other writes are in flight.",
        ),
        Mutant(
            "validate_after_decode_failure",
            "StickyEnd",
            ("handoff_decode_fail",),
            "issue #21 item 3 (decode validates and installs an attempt it has failed)",
            "DecodeValidate, DecodeCommit and DecodeStep do not read the attempt's failed"
            " status on decode (DecodeFail): a failed attempt is installed and stepped.",
        ),
        Mutant(
            "retract_loses_kv",
            "NothingLost",
            ("handoff_retract",),
            "sglang #31905 (decode retraction without a host copy keeps the request to resume)",
            "DecodeRetract frees the only complete copy and leaves the request running.",
        ),
        Mutant(
            "retract_keeps_epoch",
            "NoReuseUnderIO",
            ("handoff_retract",),
            "#21 item 5 (a refetch reuses the retracted attempt's room/epoch)",
            "PrefillFreeze of a refetch re-opens the old epoch: a late Ready of the first"
            " attempt starts writes into the decode blocks the retraction freed.",
        ),
        Mutant(
            "decode_runs_before_all_ranks",
            "RankAgreement",
            ("handoff_tp1to2",),
            "#21 item 6 (decode TP: the scheduler reads one rank's receive status)",
            "DecodeCommit commits once any decode rank installed, not every one.",
        ),
        Mutant(
            "stale_incarnation_accepted",
            "Fencing",
            ("restart_handoff",),
            "restarts (#21): a Ready of a dead decode incarnation accepted after its restart",
            "Receivers take a control message of a worker's older incarnation as current.",
        ),
        Mutant(
            "restart_keeps_pool",
            "NoReuseUnderIO",
            ("restart_handoff",),
            "restarts (#21): the restarted decode honours the dead incarnation's registration",
            "A one-sided write to the old incarnation's registration lands in the new pool.",
        ),
        Mutant(
            "prefix_hash_unchecked",
            "ContentIdentity",
            ("identity_prefix",),
            "issue 21 item 7 (a recycled prefix block matched by a lookup without its hash)",
            "DecodeReserve counts the cached prefix as a hit without comparing its blocks'"
            " hash with the manifest's: decode uses another request's KV.",
        ),
        Mutant(
            "unstaged_block_advertised",
            "ContentIdentity",
            ("identity_prefix",),
            "issue 21 item 7 (the sender advertises a block it never staged)",
            "PrefillSendChunk sends a block's chunk before the block is staged.",
        ),
        Mutant(
            "slot_reused_unfenced",
            "Fencing",
            ("slots_two",),
            "issue 21 item 8 (a metadata slot / room reused while a notification is late)",
            "DecodeReceiveDone resolves a late RankDone by its slot id alone and counts it for"
            " the slot's new holder.",
        ),
        Mutant(
            "evict_pinned_copy",
            "NoReuseUnderIO",
            ("host_cache_warm",),
            "issue 22 item 1; sglang #31108 (a host page evicted between exists and get)",
            "HostFree frees an unpublished host-cache copy whatever its pins: a lookup hit"
            " (or a load) still reads the freed bytes.",
        ),
        Mutant(
            "unpin_at_load_start",
            "CapacityRefcount",
            ("host_cache_warm",),
            "issue 22 item 1 (the lookup's pin dropped when the load starts, not when it"
            " completes: the copy can be evicted under the load)",
            "HostLoadBegin drops the lookup's pin: the pin count no longer covers the load.",
        ),
        Mutant(
            "reload_consumes_shared",
            "NoReuseUnderIO",
            ("host_cache_warm",),
            "issue 22 item 1 (a reload consumes the host copy, as a swap-in does, while"
            " another request's lookup pinned it)",
            "HostLoadCommit frees the shared host copy after its own load.",
        ),
        Mutant(
            "publish_before_commit",
            "PublishAfterCommit",
            ("host_cache_store",),
            "issue 22 item 2; LMCache #4991, Mooncake #3030 (a key visible before its bytes)",
            "HostPublish makes the key visible before every block of the store is written.",
        ),
        Mutant(
            "late_completion_publishes",
            "PublishAfterCommit",
            ("host_cache_store",),
            "issue 22 item 2; Mooncake #3030 (a stale PutEnd of an older attempt)",
            "HostLateComplete, the completion of a given-up store attempt, publishes the key.",
        ),
        Mutant(
            "failed_load_counted_loaded",
            "NoPartialUse",
            ("host_cache_warm",),
            "issue 22 item 3; dynamo #15079 (a failed load counted as loaded)",
            "HostLoadFail reports the load as loaded: the request runs on unread blocks.",
        ),
        Mutant(
            "failed_load_keeps_hit",
            "RecoverWithoutTimeout",
            ("host_cache_warm",),
            "issue 22 item 3; vllm #49176 (a failed load keeps its stale hit: livelock)",
            "HostLoadFail leaves the unreadable copy published: the next lookup hits it"
            " again, and the load fails again, until an eviction or a cancel.",
        ),
        Mutant(
            "append_after_evict",
            "NothingLost",
            ("turns_append",),
            "issue 22 item 5 (turn 2 appended to decode KV evicted between turns)",
            "TurnRoute routes the next turn to decode on the session's record alone, without"
            " checking that decode still holds its KV: the append lands on freed blocks.",
        ),
        Mutant(
            "append_divergent_uncut",
            "ContentIdentity",
            ("turns_append",),
            "issue 22 item 5 (appended from a prefix that no longer matches the tokens)",
            "DecodeAppend appends after decode's whole KV instead of cutting the tail that"
            " the new prompt does not share: the turn decodes on another history's KV.",
        ),
        Mutant(
            "two_writers_on_session",
            "SingleWriter",
            ("turns_append",),
            "issue 22 item 5 (one writer per session)",
            "TurnRoute routes the next turn while the session's turn still decodes: the"
            " append and the decode steps write the same session's KV.",
        ),
        Mutant(
            "evict_pinned_session",
            "NothingLost",
            ("turns_append",),
            "issue 22 item 5 (the session's blocks pinned from routing until the append)",
            "SessionEvict ignores the pin the routing decision took: the turn routed to"
            " decode finds its session's KV gone (half-appended).",
        ),
        Mutant(
            "reject_unfenced",
            "SingleWriter",
            ("reject_dup",),
            "issue 25 item 4; vllm-ascend #13929 (a rejected attempt's transfer metadata"
            " reused by a retried request)",
            "DecodeReject sends the Nack but leaves dep below the rejected epoch: a copy of"
            " the rejected Handoff reserves once room frees, the source takes its Ready and"
            " sends, decode commits, and the Nack thaws the source: two writers.",
        ),
        Mutant(
            "release_keeps_wait",
            "Frozen",
            ("handoff_crash",),
            "issue 27 item 2 (a release that keeps the wait state: the handoff timer of a"
            " committed request is never disarmed)",
            "PrefillRelease frees the source on decode's Ack but leaves the sender waiting"
            " for it (await_ack): the request's handoff timer still runs and fails the"
            " committed request. No property of a state reads it; INVARIANTS.md's Frozen does.",
        ),
        Mutant(
            "stream_reads_at_ready",
            "NoReuseUnderIO",
            ("stream_one",),
            "issue 30 bug 2 (a streamed offer reads its source blocks at the receiver's"
            " Ready, not at send_layer: freed and reused blocks ship another request's bytes)",
            "PrefillSendLayer takes no copy of the layer: its bytes are read when the chunk"
            " is sent, after the engine may have given the blocks back (PrefillFreeSource).",
        ),
        Mutant(
            "layer_ready_on_staging",
            "NoPartialUse",
            ("stream_one",),
            "issue 30 bug 1 (Receiver.layer_ready True while the layer is only in staging)",
            "DecodeLayerReady reports a layer once it landed in decode's staging copy,"
            " before DecodeInstallLayer put it in the blocks the engine reads.",
        ),
        Mutant(
            "window_prunes_under_io",
            "NoReuseUnderIO",
            ("window_prune",),
            "issue 32 item 3 (sliding-window pruning frees blocks an offload store or a"
            " handoff still reads: vLLM SlidingWindowManager.remove_skipped_blocks)",
            "PrefillPruneWindow frees the oldest block of a frozen copy while a store or a"
            " handoff of it still reads it (the other requests get the block at once).",
        ),
    )
}


def get_mutant(name: str) -> Mutant:
    if name in MUTANTS:
        return MUTANTS[name]
    raise KeyError(f"unknown mutant {name!r}; valid mutants: {', '.join(MUTANTS)}")
