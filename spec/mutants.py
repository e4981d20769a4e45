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
    )
}


def get_mutant(name: str) -> Mutant:
    if name in MUTANTS:
        return MUTANTS[name]
    raise KeyError(f"unknown mutant {name!r}; valid mutants: {', '.join(MUTANTS)}")
