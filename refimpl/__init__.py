"""The torch reference implementation of KV-cache ownership, usable as a library.

The public handoff API (``refimpl.api``, re-exported here): ``KVGeometry`` (one type for a
side's paged KV: layers, global and per-rank KV heads, head dim, block size, dtype, axis
order, TP/CP, with converters to and from the manifest), ``ModelIdentity``, ``Sender`` and
``Receiver`` (built from pools, a geometry and a transport; TP, block-size and layout
conversion built in), ``handoff()`` (the whole transfer in one call; ``Handoff`` in
steps), ``offload``/``reload`` (verified copies between tiers; ``begin_offload``/
``begin_reload`` in steps), ``channels`` and ``State``. Cache adapters for
transformers, vLLM and SGLang layouts live in ``refimpl.adapters``.

The data path under it, each piece usable on its own: ``blocks`` (torch-free block
bookkeeping: owners, pins, refcounts, quarantine, ``check_integrity``), ``pool`` (paged KV
pools), ``checksum`` (xxh3 over raw bytes), ``transport`` (bytes + JSON messages with fault
hooks), ``chunks`` (freeze, manifest, verified chunk send/receive with epoch fencing),
``reshard`` (TP/CP/block-size/axis-order conversion), ``errors`` (typed refusals naming
the spec's property), ``costmodel`` (the seed's payload formula), ``model`` (a tiny
GQA+RoPE decoder), ``transport_dist`` (the transport over torch.distributed P2P, one
process per side or per TP rank).

Built on it: ``engine`` (one method per spec action, ``abstract()`` to a spec state),
``testing`` (the Hypothesis machines, parametrised by your implementation), ``demo``
(handoff paths on the tiny model), ``replay`` (counterexamples on real tensors),
``cluster`` (prefill and decode as separate processes on torch.distributed), ``tiers``
(the disk tier's files, chunk keys and transfers, ``DiskTier`` in the API).

The API names load on first use, so ``import refimpl.blocks`` stays torch-light.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# torch warns at import when numpy is not installed ("Failed to initialize NumPy"): the
# reference implementation never converts a tensor to numpy, so numpy is no dependency
# and that one warning is noise. Filtered before any refimpl module imports torch.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

_API = (
    "Channels",
    "Handoff",
    "HandoffResult",
    "KVGeometry",
    "ModelIdentity",
    "Received",
    "Receiver",
    "Sender",
    "State",
    "begin_offload",
    "begin_reload",
    "channels",
    "handoff",
    "offload",
    "read_kv",
    "reload",
    "write_kv",
    "write_kv_layer",
    "DiskTier",
    "Stored",
    "HostTier",
    "Kept",
)

__all__ = [
    *_API,
    "adapters",
    "api",
    "blocks",
    "checksum",
    "chunks",
    "cluster",
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
    "transport_dist",
    "tiers",
]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module("refimpl.api"), name)
    if name in __all__:
        return importlib.import_module(f"refimpl.{name}")
    raise AttributeError(f"module 'refimpl' has no attribute {name!r}")
