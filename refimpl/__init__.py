"""The torch reference implementation of KV-cache ownership.

The data path, each piece usable on its own: ``blocks`` (torch-free block bookkeeping:
owners, pins, refcounts, quarantine, ``check_integrity``), ``pool`` (paged KV pools, pinned
host pools), ``checksum`` (xxh3 over raw bytes), ``transport`` (bytes + JSON messages with
fault hooks), ``chunks`` (freeze, manifest, verified chunk send/receive with epoch fencing),
``reshard`` (TP/CP/block-size/axis-order conversion), ``errors`` (typed refusals naming the
spec's property), ``costmodel`` (the seed's payload formula), ``model`` (a tiny GQA+RoPE
decoder).

Built on it: ``engine`` (one method per spec action, ``abstract()`` to a spec state),
``testing`` (the Hypothesis machine, parametrised by your implementation), ``demo``
(handoff paths on the tiny model), ``replay`` (counterexamples on real tensors).
"""

__all__ = [
    "blocks",
    "checksum",
    "chunks",
    "costmodel",
    "demo",
    "engine",
    "errors",
    "model",
    "pool",
    "replay",
    "reshard",
    "testing",
    "transport",
]
