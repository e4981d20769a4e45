"""The worlds of the shared host cache (spec/behaviours/host_cache.py), as ``Config``
keyword arguments: ``spec/config.py`` builds them (this module imports nothing of spec,
so that config.py may import it without a cycle)."""

from __future__ import annotations

from typing import Any

__all__ = ["HC_DEEP", "HC_DEFAULT", "HC_FAULTS", "HC_WORLDS"]

HC_FAULTS = frozenset({"load_fail"})  # EnvLoadFail: the copy's bytes become unreadable

HC_WORLDS: tuple[dict[str, Any], ...] = (
    {
        "name": "host_cache_warm",
        "doc": "two requests, 2 blocks, a warm shared host cache (one published copy of their"
        " prefix key): lookups pin it, loads do not consume it; eviction in two phases;"
        " the copy's bytes may become unreadable (a failed load)",
        "n_reqs": 2,
        "blocks": 2,
        "cap_p": 4,
        "cap_h": 2,
        "handoff": False,
        "cancel": True,
        "faults": 1,
        "fault_kinds": HC_FAULTS,
        "max_attempts": 1,
        "host_cache": 2,
    },
    {
        "name": "host_cache_store",
        "doc": "two requests, 1 block, a cold shared host cache: one computes and stores the"
        " key (publish after commit), a store may be given up and complete late; the"
        " other looks it up",
        "n_reqs": 2,
        "blocks": 1,
        "cap_p": 2,
        "cap_h": 2,
        "handoff": False,
        "cancel": False,
        "max_attempts": 1,
        "host_cache": 1,
    },
)
HC_DEFAULT: tuple[str, ...] = ("host_cache_warm", "host_cache_store")
HC_DEEP: tuple[str, ...] = ()
