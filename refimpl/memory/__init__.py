"""Paged KV memory behind the handoff API: the interface, and engines' registered caches.

``BlockMemory`` (``interface``) is what the API asks of one TP rank's memory; kvown's own
``refimpl.pool.KVPool`` is one implementation, ``RegisteredPool`` (``registered``) the
other: an engine's KV tensors, per layer or one cross-layer tensor, in the layouts vLLM's
attention backends use (``layouts``: FlashAttention, FlashInfer, NHD and HND), read and
written in place through views (``views``). ``register_kv_caches`` builds a worker's
``RegisteredPools`` from them; their ``EngineBlocks`` table takes the scheduler's block
ids (``adopt``, ``Receiver.expect(blocks=...)``) and says when each may be freed or
reused (``freeable``, ``release``): kvown never frees an engine block itself.

The names load on first use (``refimpl.pool`` imports ``views`` and ``interface``).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BlockMemory": "refimpl.memory.interface",
    "EngineBlocks": "refimpl.memory.engine_blocks",
    "LAYOUTS": "refimpl.memory.layouts",
    "RegisteredPool": "refimpl.memory.registered",
    "RegisteredPools": "refimpl.memory.registered",
    "register_kv_caches": "refimpl.memory.registered",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'refimpl.memory' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
