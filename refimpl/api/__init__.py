"""The public handoff API: what an engine author imports.

``KVGeometry`` (one description of a side's paged KV, with converters), ``ModelIdentity``
(model, adapter, quantization, RoPE), ``Sender`` and ``Receiver`` (model-agnostic ends:
pools + geometry + transport), ``handoff()`` (the whole transfer in one call;
``Handoff`` the same in steps), ``offload``/``reload`` (verified copies between tiers;
``begin_offload``/``begin_reload`` the same in steps), ``channels`` (the two channel names
of a request, for fault injection), ``State``, and ``write_kv``/``read_kv`` (contiguous
per-token KV <-> a request's blocks, batched, asking the allocator; ``write_kv_layer``
one layer as prefill computes it). ``Sender.offer(..., layers=L)`` + ``send_layer`` and
``Receiver.layer_ready`` hand a request off layer by layer; ``Sender(..., rank=r)`` is one
TP rank's Sender in its own process (every rank offers the same ``epoch=``). ``forget``
on both ends drops an ended request's records. ``mutants=`` on ``Sender``/``Receiver``
re-enables one fixed silent-corruption bug by name (``refimpl.api.switches``), for tours
and tests only. ``DiskTier`` (a directory of crash-safe safetensors
chunk files keyed by chained prefix hashes) is a tier ``offload``/``reload`` take in place
of host pools (``Stored``: the published chunks; ``Reloaded``: the longest stored prefix,
verified; nothing stored or a bad first chunk is a miss, ``MissError``);
``refimpl.api.offload.offload_async``/``reload_async`` return a ``Transfer`` to poll,
wait on or cancel. ``HostTier`` is the host's prefix cache on the same chunk keys
(``Kept``: the chunks held; a longer prompt hits a shorter one's chunks there too).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# The names load on first use (PEP 562), so importing one module of the package
# (``refimpl.api.geometry``, say, as ``refimpl.tiers`` does) runs no other: the package
# holds no import cycle through this file (tests/architecture/test_layout.py).
_WHERE = {
    "DiskTier": "refimpl.api.disk",
    "Stored": "refimpl.api.disk",
    "KVGeometry": "refimpl.api.geometry",
    "ModelIdentity": "refimpl.api.geometry",
    "Handoff": "refimpl.api.handoff",
    "HandoffResult": "refimpl.api.handoff",
    "handoff": "refimpl.api.handoff",
    "begin_offload": "refimpl.api.offload",
    "begin_reload": "refimpl.api.offload",
    "offload": "refimpl.api.offload",
    "reload": "refimpl.api.offload",
    "Received": "refimpl.api.receiver",
    "Receiver": "refimpl.api.receiver",
    "Sender": "refimpl.api.sender",
    "read_kv": "refimpl.api.tokens",
    "write_kv": "refimpl.api.tokens",
    "write_kv_layer": "refimpl.api.tokens",
    "Channels": "refimpl.api.wire",
    "State": "refimpl.api.wire",
    "channels": "refimpl.api.wire",
    "HostTier": "refimpl.tiers.host",
    "Kept": "refimpl.tiers.host",
}

if TYPE_CHECKING:
    from refimpl.api.disk import DiskTier, Stored
    from refimpl.api.geometry import KVGeometry, ModelIdentity
    from refimpl.api.handoff import Handoff, HandoffResult, handoff
    from refimpl.api.offload import begin_offload, begin_reload, offload, reload
    from refimpl.api.receiver import Received, Receiver
    from refimpl.api.sender import Sender
    from refimpl.api.tokens import read_kv, write_kv, write_kv_layer
    from refimpl.api.wire import Channels, State, channels
    from refimpl.tiers.host import HostTier, Kept

__all__ = [
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
]


class _Package(types.ModuleType):
    """This package, keeping a function's name where a submodule has the same one.

    Once ``refimpl.api.handoff`` (or ``.offload``) has run, the import system sets it as
    this package's attribute, which would hide the function ``handoff`` (``offload``)
    that ``from refimpl.api import handoff`` must give: the name keeps the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'refimpl.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
