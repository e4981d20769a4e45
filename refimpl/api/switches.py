"""Bug switches of the public API: each re-enables one fixed silent-corruption bug, so a
tour or a test can show that it is caught (a mutant). Never for serving.

    Sender(..., mutants={"stream_reads_at_ready"})
    Sender(..., mutants={"quiesced_at_nack"})
    Sender(..., mutants={"quiesced_at_abort"})
    begin_offload(..., mutants={"release_before_install"})
    DiskTier(..., mutants={"failed_load_keeps_hit"})
    DiskTier(..., mutants={"failed_store_visible"})
    Receiver(..., mutants={"layer_ready_on_staging"})
    Receiver(..., mutants={"free_quarantine_early"})
    Receiver(..., mutants={"prefix_unreferenced"})
    RankReceiver(..., mutants={"ready_on_own_install"})
    RankSender(..., mutants={"heads_of_another_rank"})
    RankSender(..., mutants={"slice_read_at_ready"})
    RankReceiver(..., mutants={"rank_accepts_dead_incarnation"})

``stream_reads_at_ready`` (FrozenSnapshot / NoReuseUnderIO, issue #30 bug 2): a streamed
offer reads a layer's bytes from its blocks when it sends them (at the receiver's ready
for a layer computed before it), not at ``send_layer``; blocks freed and reused in
between ship another request's bytes, sealed as this one's.

``layer_ready_on_staging`` (NoPartialUse, issue #30 bug 1): ``Receiver.layer_ready`` says
True once a layer landed in the staging copy (a block-size change, ``stage=True``),
while the blocks ``held()`` names still hold what was there before.

``stale_incarnation_accepted`` (Fencing, restarts; the spec's mutant of the same name):
a ``Sender`` or ``Receiver`` takes a control message of its peer's older incarnation
(a dead receiver's ready, a dead sender's manifest) as current, after it heard of the
restart (``peer_restarted``).

``ready_on_own_install`` (RankAgreement, decode ranks; the spec's
``decode_runs_before_all_ranks``): a ``RankReceiver`` takes the request as ready once its
own heads committed, without waiting for every other decode rank's install.

``rank_accepts_dead_incarnation`` (Fencing, decode ranks with restarts): a
``RankReceiver``'s sub-handoff takes a manifest, seal or abort of a prefill rank's dead
incarnation as current after the membership said that rank restarted
(``peer_restarted``): a dead prefill's manifest, still in flight when it crashed, is
answered (a reservation or a nack) as if its incarnation were alive.

``heads_of_another_rank`` (a reshard off by one rank): a ``RankSender`` sends each
decode rank the slice of its neighbour's heads (decode rank d gets rank d + 1's, the
last rank the first's); both ends check and seal the same wrong bytes.

``slice_read_at_ready`` (FrozenSnapshot / NoReuseUnderIO, decode ranks streamed layer by
layer; issue #30 bug 2 on a rank): a ``RankSender`` hands each sub-handoff that sends a
slice of its heads (a narrower decode rank: a view of the pools, ``head_slice``) the
view alone at ``send_layer``, no copy: that sub-handoff reads the slice when it sends it
(at its decode rank's ready), after the engine may have freed and reused the blocks.

``quiesced_at_nack`` (NoReuseUnderIO / FrozenSnapshot, an unrevocable transport; the
spec's ``batch_status_subset`` taken to none of the batch): a nacked ``Sender`` says
Quiesced at once, while writes of the attempt are still pending at the transport; the
Receiver frees its quarantine on it and a write still lands in the freed blocks.

``quiesced_at_abort`` (NoReuseUnderIO, an unrevocable transport; the spec refuses
``PrefillTimeout`` while a write of the attempt is in flight): a ``Sender`` whose
``abort`` (a cancel, a timeout, a sibling rank's) comes while writes of the attempt are
still pending at the transport ends at once: it drops its pins (the engine may reuse the
source blocks a write still reads) and says Quiesced (its abort) to the receiver, which
frees its quarantine while a write is still in flight.

``release_before_install`` (NothingLost / PublishAfterCommit; the spec's mutant of the
same name): a ``Sender`` with ``free_source`` frees the request's source blocks as soon as
its chunks and seals are sent, not at the receiver's ack; an offload
(``refimpl.api.offload.begin_offload``, ``free_device``) then frees the device copy
before the host copy is committed, so a store that fails leaves no copy at all.

``free_quarantine_early`` (NoReuseUnderIO, an unrevocable transport; the spec's
``free_on_cancel_in_flight``): a ``Receiver`` that gives up an attempt whose writes may
still land frees its blocks at once instead of quarantining them until the writer's
Quiesced (``refimpl.api.unrevocable``).
``prefix_unreferenced`` (CapacityRefcount / NoReuseUnderIO, a decode-side prefix): a
``Receiver`` uses the prefix blocks the engine lent it (``expect(prefix=...)``) without
taking its own reference on them: the attempt reads and names them (``held``, ``result``)
while only the engine's prefix cache holds them, so the cache may evict them and reuse
them for another request's KV under a live transfer or a committed request.

``failed_load_keeps_hit`` (the spec's mutant of the same name, vLLM #49176): a
``DiskTier`` load whose bytes failed their checksum is a miss for that reader (nothing is
committed) but the chunk stays published: the next lookup hits the unreadable copy
again and every load of it fails (the spec's HostLoadFail unpublishes it).

``failed_store_visible`` (PublishAfterCommit / NothingLost; the spec's mutant of the same
name): a ``DiskTier`` store's writer asks ``stop()`` before its renames but renames
anyway, so a store cancelled once its last file is written (``Transfer.cancel``, the
engine's EnvStoreFail) is published, and with ``free_device`` the device copy is freed:
the engine that gave the store up finds a copy it thinks failed, and no device copy.
"""

from __future__ import annotations

from collections.abc import Iterable

STREAM_READS_AT_READY = "stream_reads_at_ready"
LAYER_READY_ON_STAGING = "layer_ready_on_staging"
STALE_INCARNATION_ACCEPTED = "stale_incarnation_accepted"
QUIESCED_AT_NACK = "quiesced_at_nack"
QUIESCED_AT_ABORT = "quiesced_at_abort"
RELEASE_BEFORE_INSTALL = "release_before_install"
SENDER_SWITCHES = frozenset(
    {
        STREAM_READS_AT_READY,
        STALE_INCARNATION_ACCEPTED,
        QUIESCED_AT_NACK,
        QUIESCED_AT_ABORT,
        RELEASE_BEFORE_INSTALL,
    }
)
FREE_QUARANTINE_EARLY = "free_quarantine_early"
PREFIX_UNREFERENCED = "prefix_unreferenced"
RECEIVER_SWITCHES = frozenset(
    {LAYER_READY_ON_STAGING, STALE_INCARNATION_ACCEPTED, FREE_QUARANTINE_EARLY, PREFIX_UNREFERENCED}
)
READY_ON_OWN_INSTALL = "ready_on_own_install"
HEADS_OF_ANOTHER_RANK = "heads_of_another_rank"
RANK_ACCEPTS_DEAD_INCARNATION = "rank_accepts_dead_incarnation"
RANK_RECEIVER_SWITCHES = frozenset({READY_ON_OWN_INSTALL, RANK_ACCEPTS_DEAD_INCARNATION})
SLICE_READ_AT_READY = "slice_read_at_ready"
RANK_SENDER_SWITCHES = frozenset({HEADS_OF_ANOTHER_RANK, SLICE_READ_AT_READY})
FAILED_LOAD_KEEPS_HIT = "failed_load_keeps_hit"
FAILED_STORE_VISIBLE = "failed_store_visible"
TIER_SWITCHES = frozenset({FAILED_LOAD_KEEPS_HIT, FAILED_STORE_VISIBLE})
API_SWITCHES = (
    SENDER_SWITCHES
    | RECEIVER_SWITCHES
    | RANK_RECEIVER_SWITCHES
    | RANK_SENDER_SWITCHES
    | TIER_SWITCHES
)


def check_switches(mutants: Iterable[str], known: frozenset[str], who: str) -> frozenset[str]:
    """The switches asked for, or ValueError naming the unknown ones and the known."""
    if isinstance(mutants, str):
        raise ValueError(f"{who}: mutants={mutants!r} must be a set of names, not a string")
    asked = frozenset(mutants)
    if unknown := asked - known:
        raise ValueError(f"{who}: unknown mutants {sorted(unknown)}; known: {sorted(known)}")
    return asked
