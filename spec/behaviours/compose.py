"""Worlds built from a log (issue #32): the behaviours a log declares, each one switch of
the one ``Config``, and the sizes it gives or shows.

Every behaviour is a switch, and every combination of switches is defined: an action
reads only the switches and state fields it needs, and the interactions of each pair are
in SPEC.md ("Behaviours that compose"). ``world(...)`` turns a log header's
``behaviours``, ``faults`` and ``sizes`` into a ``Config`` (``from_log``); ``grown(...)``
widens it as the log shows more (``model_checks/conformance`` calls it at each logged
step): another request, another attempt, turn or move, another logged fault or restart.
What cannot grow after the first event (blocks, TP ranks, the resident prefix, a warm
cache, the pools' capacities) is given in ``sizes`` or read from the log before the
check starts (``model_checks/conformance/sizing.py``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from spec.config import FAULT_KINDS, Config

__all__ = ["BEHAVIOURS", "FAULT_OF", "NEEDS", "SIZES", "UNBOUNDED", "grown", "smallest", "world"]

# behaviour name -> the Config switches it sets (the core handoff and cancel are always on)
BEHAVIOURS: dict[str, dict[str, Any]] = {
    "offload": {"offload": True},
    "recompute": {"recompute": True},
    "async_steps": {"async_steps": True},
    "unrevocable": {"revocable": False},
    "decode_failure": {"decode_failure": True},
    "retract": {"retract": True},
    "decode_ranks": {"decode_ranks": True},
    "restarts": {},  # the budget grows with each logged EnvRestart (crash implied)
    "identity": {"identity": True},
    "slots": {"slots": True},
    "host_cache": {"host_cache": 1},
    "host_cache_warm": {"host_cache": 2},
    "turns": {"turns": True},
    "no_cancel": {"cancel": False},
    "window": {"window": True},  # sliding-window pruning (window/__init__.py)
}
# header size key -> Config field
SIZES: dict[str, str] = {
    "requests": "n_reqs",
    "blocks": "blocks",
    "src_tp": "src_tp",
    "dst_tp": "dst_tp",
    "prefix": "prefix",
    "cap_p": "cap_p",
    "cap_d": "cap_d",
    "cap_h": "cap_h",
    "faults": "faults",
    "attempts": "max_attempts",
    "moves": "max_moves",
    "turns": "max_turns",
    "restarts": "restarts",
}
_MOST = {"n_reqs": 4096, "max_attempts": 15, "restarts": 15, "max_turns": 15}  # Config's
UNBOUNDED = 1 << 20  # a pool whose capacity the log does not state: it never runs out
# a logged fault action -> the fault kind it is
FAULT_OF: dict[str, str] = {
    "EnvLose": "lose",
    "EnvDuplicate": "duplicate",
    "EnvCorrupt": "corrupt",
    "EnvManifestMismatch": "mismatch",
    "EnvCrash": "crash",
    "EnvStoreFail": "store_fail",
    "EnvLoadFail": "load_fail",
}


def world(behaviours: list[str], faults: list[str], sizes: dict[str, int]) -> Config:
    """The world a log declares; ValueError names an unknown behaviour, fault or size."""
    if bad := sorted(set(behaviours) - BEHAVIOURS.keys()):
        raise ValueError(f"unknown behaviours {bad}; known: {sorted(BEHAVIOURS)}")
    if bad := sorted(set(faults) - FAULT_KINDS):
        raise ValueError(f"unknown fault kinds {bad}; known: {sorted(FAULT_KINDS)}")
    if bad := sorted(set(sizes) - SIZES.keys()):
        raise ValueError(f"unknown sizes {bad}; known: {sorted(SIZES)}")
    kw: dict[str, Any] = {"blocks": 1, "max_attempts": 1, "max_moves": 1, "faults": 1}
    for b in behaviours:
        kw.update(BEHAVIOURS[b])
    kinds = set(faults) | ({"crash"} if "restarts" in behaviours else set())
    kw.update({SIZES[k]: v for k, v in sizes.items()})
    for cap in ("cap_p", "cap_d", "cap_h"):
        kw.setdefault(cap, UNBOUNDED)
    parts = sorted(set(behaviours)) + [f"fault:{k}" for k in sorted(kinds)]
    return Config(
        name="log:" + ",".join(parts) if parts else "log",
        doc="a world built from a log's header (spec/EVENTLOG.md)",
        fault_kinds=frozenset(kinds),
        from_log=True,
        **kw,
    )


def grown(c: Config, kind: str | None = None, more_faults: int = 0, **at_least: int) -> Config:
    """``c`` with each named size raised to at least the given value, fault ``kind`` (one
    the log showed) added, and the fault budget widened by ``more_faults``."""
    kw: dict[str, Any] = {}
    for f, v in at_least.items():
        v = min(v, _MOST.get(f, v))  # past the bound the step is judged, not the world grown
        if v > getattr(c, f):
            kw[f] = v
    if more_faults:
        kw["faults"] = c.faults + more_faults
    if kind is not None and kind not in c.fault_kinds:
        kw["fault_kinds"] = c.fault_kinds | {kind}
    return replace(c, **kw) if kw else c


# behaviour -> the least sizes it needs to show itself in an explored world (``smallest``)
NEEDS: dict[str, dict[str, int]] = {
    "offload": {"cap_h": 1},
    "host_cache": {"cap_h": 1},
    "host_cache_warm": {"cap_h": 1},
    "decode_ranks": {"dst_tp": 2},
    "identity": {"prefix": 1},
    "window": {"blocks": 2},  # one block is never pruned
    "restarts": {"restarts": 1},
}


def smallest(behaviours: list[str], kinds: list[str], **sizes: int) -> Config:
    """The smallest explorable world with ``behaviours`` and fault ``kinds`` on (one request,
    one block, one attempt, a fault budget of one when a fault kind is named, each
    behaviour's ``NEEDS``, then ``sizes``), its pools just large enough for its requests
    (``tests/explorer`` explores every pair of them)."""
    on = set(kinds) | ({"crash"} if "restarts" in behaviours else set())
    kw: dict[str, Any] = {"blocks": 1, "max_attempts": 1, "faults": 1 if on else 0}
    for b in behaviours:
        kw.update(BEHAVIOURS[b])
        for f, v in NEEDS.get(b, {}).items():
            kw[f] = max(kw.get(f, 0), v)
    kw.update(sizes)
    n, blocks, prefix = kw.get("n_reqs", 1), kw["blocks"], kw.get("prefix", 0)
    kw.update(cap_p=n * blocks, cap_d=n * blocks + prefix)
    if kw.get("cap_h"):  # a store or a warm copy holds a whole request's blocks
        kw["cap_h"] = max(kw["cap_h"], blocks)
    parts = sorted(set(behaviours)) + [f"fault:{k}" for k in sorted(on)]
    return Config(
        name="smallest:" + ",".join(parts + [f"{k}={v}" for k, v in sorted(sizes.items())]),
        doc="the smallest world with these behaviours (spec/behaviours/compose.py)",
        fault_kinds=frozenset(on),
        **kw,
    )
