"""Where the API leaves the spec: every divergence class the tour on the API finds today
(``tour.gap_of``), with its reason. A gap is a finding, not an excuse: each names either
an API bug (the API must change) or a spec question (the spec may be too strict for a
revocable transport); ``tests/fuzz/test_api_tour.py`` pins the set per world, so that a
fix (a class gone) and a regression (a new class) both fail until this table says so.
"""

from __future__ import annotations

__all__ = ["API_BUG", "GAPS", "SPEC_QUESTION"]

API_BUG, SPEC_QUESTION = "api bug", "spec question"

_QUARANTINE = (
    SPEC_QUESTION,
    "the Receiver gives up a cancelled (or corrupt, ended) attempt's blocks at once, its "
    "transport revoking the writes in flight (SpecTransport.abort, as the spec's fence); "
    "the spec's DecodeAbort quarantines them until the writer quiesces, even on a "
    "revocable transport",
)
_COMMIT_AFTER_CANCEL = (
    API_BUG,
    "the Receiver verifies and commits inside poll() once every layer and seal is in, "
    "also for a request the router has cancelled: it hears of the cancel only through "
    "abort(); the spec refuses DecodeValidate/DecodeCommit after a sticky end (StickyEnd)",
)

_LAYER_CHUNKS = (
    SPEC_QUESTION,
    "a streamed Sender sends each layer's chunks as soon as the layer is given and the "
    "receiver is ready (one message per layer); the spec's chunk is a (rank, block) of "
    "every layer, sent once every layer was given (spec/stream/layers.py)",
)

GAPS: dict[str, tuple[str, str]] = {
    "state differs at PrefillTimeout (net)": (
        SPEC_QUESTION,
        "Sender.abort leaves its chunks in flight (the Receiver fences an ended attempt's "
        "late chunks once it has the abort: Fences/Inbox); the spec's PrefillTimeout "
        "flushes them (revocable: drop_chunks), so none lands after the sender gave up",
    ),
    "state differs at DecodeReclaim (net)": (
        SPEC_QUESTION,
        "the Receiver answers a sender's abort with a Nack to every rank (the ranks agree "
        "on the end); the spec's DecodeReclaim frees and sends nothing",
    ),
    "state differs at DecodeAbort (d)": _QUARANTINE,
    "state differs at DecodeAbort (d, net)": _QUARANTINE,
    "state differs at DecodeAbort (d, rmask)": _QUARANTINE,
    "state differs at DecodeAbort (d, net, rmask)": _QUARANTINE,
    "state differs at DecodeReceiveChunk (d, landed, net)": _QUARANTINE,
    "state differs at DecodeReceiveChunk (d, landed, net, rmask)": _QUARANTINE,
    "state differs at DecodeReceiveChunk (d, net)": _COMMIT_AFTER_CANCEL,
    "state differs at DecodeReceiveDone (d, net)": _COMMIT_AFTER_CANCEL,
    "state differs at DecodeReject (net)": (
        API_BUG,
        "a Receiver cannot refuse the manifest of a request the router has ended: abort() "
        "before an attempt is a no-op and there is no reject(), so the scheduler polls "
        "(a Ready goes out) and then aborts (a Nack follows); the spec sends the Nack alone",
    ),
    "state differs at DecodeReject (dep)": (
        API_BUG,
        "a manifest the Receiver refuses at intake leaves no record of its epoch: a copy "
        "of it is judged again, and may reserve (the spec's DecodeReject fences the epoch; "
        "the spec mutant reject_unfenced is this bug)",
    ),
    "state differs at DecodeReserve (dep, dfl, net)": (
        SPEC_QUESTION,
        "the Receiver refuses an incompatible manifest at intake (no Ready, nothing "
        "reserved); the spec reserves it and refuses at DecodeValidate (ManifestGate): "
        "the spec has no DecodeReject of a HandoffBadManifest",
    ),
    # streamed worlds (Config.layers, on_api/streamed.py)
    "state differs at PrefillRecvReady (net)": _LAYER_CHUNKS,
    "state differs at PrefillSendLayer (net)": _LAYER_CHUNKS,
}
