"""Bug switches of the public API: each re-enables one fixed silent-corruption bug, so a
tour or a test can show that it is caught (a mutant). Never for serving.

    Sender(..., mutants={"stream_reads_at_ready"})
    Receiver(..., mutants={"layer_ready_on_staging"})

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
"""

from __future__ import annotations

from collections.abc import Iterable

STREAM_READS_AT_READY = "stream_reads_at_ready"
LAYER_READY_ON_STAGING = "layer_ready_on_staging"
STALE_INCARNATION_ACCEPTED = "stale_incarnation_accepted"
SENDER_SWITCHES = frozenset({STREAM_READS_AT_READY, STALE_INCARNATION_ACCEPTED})
RECEIVER_SWITCHES = frozenset({LAYER_READY_ON_STAGING, STALE_INCARNATION_ACCEPTED})
API_SWITCHES = SENDER_SWITCHES | RECEIVER_SWITCHES


def check_switches(mutants: Iterable[str], known: frozenset[str], who: str) -> frozenset[str]:
    """The switches asked for, or ValueError naming the unknown ones and the known."""
    if isinstance(mutants, str):
        raise ValueError(f"{who}: mutants={mutants!r} must be a set of names, not a string")
    asked = frozenset(mutants)
    if unknown := asked - known:
        raise ValueError(f"{who}: unknown mutants {sorted(unknown)}; known: {sorted(known)}")
    return asked
