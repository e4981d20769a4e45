"""Where the API leaves the spec: every divergence class the tour on the API finds
(``tour.gap_of``), with its reason. A gap is a finding, not an excuse: each names either
an API bug (the API must change) or a spec question (the spec may be too strict for a
revocable transport). Outside the streamed worlds the tour on the API covers every
edge of its worlds with no divergence (``tests/fuzz/test_api_tour.py`` asserts it stays
so, and ``kvown fuzz --tour --impl api`` prints a new class as "new").

Closed (issue #30): the Receiver heard of a request's end only through ``abort`` (API
bug: ``Receiver.end``, a manifest of an ended request is refused with a nack alone and
an attempt in progress is never committed); a manifest refused at intake left no record
of its epoch (API bug: it is fenced, the spec's DecodeReject); the spec quarantined a
cancelled attempt's blocks even on a revocable transport and reserved an incompatible
manifest (spec: DecodeAbort fences and frees at once where writes can be revoked, and
DecodeReject refuses a HandoffBadManifest at intake); a ranked Sender's abort left its
chunks in flight (API bug: ``wire.revoke``, the spec's flush at PrefillTimeout); the
Receiver answered a sender's abort with a nack to the very ranks that sent it (API bug:
only the sibling ranks that have not aborted are told); a DiskTier checks each block
as its I/O thread reads it while the spec found bad bytes only at HostLoadFail (spec: a
load's HostLoadCopy reads the copy as it is then and carries its own "read bad bytes"
fact; such a load fails, or a HostLoadFail that itself reads the next, bad block, and
the end of a load that read bad bytes, a fail or a cancel, unpublishes the copy).
"""

from __future__ import annotations

__all__ = ["API_BUG", "GAPS", "SPEC_QUESTION"]

API_BUG, SPEC_QUESTION = "api bug", "spec question"

_LAYER_CHUNKS = (
    SPEC_QUESTION,
    "a streamed Sender sends each layer's chunks as soon as the layer is given and the "
    "receiver is ready (one message per layer); the spec's chunk is a (rank, block) of "
    "every layer, sent once every layer was given (spec/stream/layers.py)",
)

GAPS: dict[str, tuple[str, str]] = {
    # streamed worlds (Config.layers, on_api/worlds/streamed.py)
    "state differs at PrefillRecvReady (net)": _LAYER_CHUNKS,
    "state differs at PrefillSendLayer (net)": _LAYER_CHUNKS,
}
