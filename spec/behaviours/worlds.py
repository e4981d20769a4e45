"""Worlds derived from others (issue #25 item 4): the worlds left out, made small enough.

Each entry names the config it is derived from and the fields it replaces
(``spec/config.py`` builds it with ``dataclasses.replace``); all are in the deep suite.

Rejections: ``reject_dup`` is ``reject_retry`` made small enough to explore.

Decode rejects an attempt it has no room for (``DecodeReject``: ``Nack(e)``, and
``dep = e``, a fence: no copy of that attempt's ``Handoff`` may reserve later). The
bug that survives when no world holds a rejection *and* a second ``Handoff`` of the
rejected attempt is a rejection that does not fence its epoch (mutant
``reject_unfenced``): a duplicate or retransmission of the rejected ``Handoff`` reserves
once room frees, the source (still waiting on that epoch) takes the ``Ready`` and sends,
decode commits, and the ``Nack`` then thaws the source: two writers. Engines: a proxy
retries a rejected decode request with the same KV-transfer metadata (vllm-ascend #13929
made each attempt single and dropped the stale metadata).

``reject_retry`` (two requests, a decode pool that fits one, two attempts, cancel, one
duplicated control message) passes the explorer's 2,000,000-state bound. The worlds
here keep what the bug needs (two requests contending for one decode slot, so a
rejection happens and room frees later; one duplicated control message) and drop what
it does not (a second attempt, the client's cancel).

Two faults: ``crash_both`` (default suite) spends its budget of 2 on crashes only.
``faults2_handoff`` spends it on any two of a lost message, a duplicated one and a crash
of either worker (a crash after a loss, a loss of the retry's message, a duplicate of a
message of the aborted attempt), with a second attempt to retry on.
"""

from __future__ import annotations

from typing import Any

DERIVED: dict[str, tuple[str, dict[str, Any]]] = {
    "reject_dup": (
        "reject_retry",
        {
            "doc": "two requests, a decode pool that fits one: a rejection, then a duplicate"
            " of the rejected Handoff; one attempt, no cancel (reject_retry made small)",
            "cancel": False,
            "max_attempts": 1,
        },
    ),
    "faults2_handoff": (
        "handoff_retract",
        {
            "doc": "one request, 1 block, fault budget 2: any two of a lost message, a"
            " duplicated one and a crash of either worker; two attempts, cancel",
            "retract": False,
            "faults": 2,
            "fault_kinds": frozenset({"lose", "duplicate", "crash"}),
        },
    ),
    "async_offload": (
        "async_handoff",
        {
            "doc": "one request, 1 block, async steps and offload/reload, no handoff, no"
            " cancel: an offload freezes the source only once no step is in flight (17"
            " states; in the default suite: the one world where async steps meet a store)",
            "handoff": False,
            "offload": True,
            "cap_h": 1,
            "cancel": False,
        },
    ),
}
DERIVED_DEFAULT = ("async_offload",)  # the derived worlds in the default suite
DERIVED_DEEP = tuple(k for k in DERIVED if k not in DERIVED_DEFAULT)  # the others

# Behaviours that compose (issue #32 item 2; SPEC.md, "Behaviours that compose"): a small
# world for each pair that interacts, and one with every behaviour on. ``spec/config.py``
# builds them (``Config(name=k, **v)``); the default suite holds the pairs, the deep suite
# the world with everything.
_CRASH = frozenset({"crash"})
COMPOSED: dict[str, dict[str, Any]] = {
    "pair_crash_host": {
        "doc": "two requests, 1 block, a cold shared host cache: one stores the key, the"
        " other looks it up and loads it; a worker may crash holding pins or a pending store",
        "n_reqs": 2,
        "blocks": 1,
        "cap_p": 2,
        "cap_h": 2,
        "handoff": False,
        "cancel": False,
        "faults": 1,
        "fault_kinds": _CRASH,
        "max_attempts": 1,
        "host_cache": 1,
    },
    "pair_restart_turns": {
        "doc": "one request, 1 block, multi-turn append; a worker may crash once during a"
        " turn (or between turns) and come back as a new incarnation",
        "blocks": 1,
        "cap_p": 1,
        "cap_d": 1,
        "faults": 1,
        "fault_kinds": _CRASH,
        "restarts": 1,
        "turns": True,
    },
    "pair_retract_async": {
        "doc": "one request, 1 block, async steps: decode may retract its copy while a step"
        " is in flight (it waits for the step), then the request is computed again",
        "blocks": 1,
        "cap_p": 1,
        "cap_d": 1,
        "async_steps": True,
        "retract": True,
    },
    "pair_identity_host": {
        "doc": "one request, 1 block: a warm shared host cache feeds prefill, the sender"
        " stages what it sends, and decode's cached prefix may be recycled",
        "blocks": 2,
        "cap_p": 2,
        "cap_d": 3,
        "cap_h": 2,
        "prefix": 1,
        "identity": True,
        "host_cache": 2,
        "max_attempts": 1,
    },
    "pair_unrevocable_retry": {
        "doc": "one request, 1 block, no revoke, two attempts: a retry after a lost message"
        " waits for the quarantine of the first attempt's writes",
        "blocks": 1,
        "cap_p": 1,
        "cap_d": 1,
        "faults": 1,
        "fault_kinds": frozenset({"lose"}),
        "revocable": False,
    },
    "pair_ranks_fail": {
        "doc": "one request, 1 block, two decode ranks install their shards; decode may fail"
        " an attempt itself; one corrupt chunk; two attempts",
        "blocks": 1,
        "dst_tp": 2,
        "faults": 1,
        "fault_kinds": frozenset({"corrupt"}),
        "decode_ranks": True,
        "decode_failure": True,
    },
}
COMPOSED["all_behaviours"] = {
    "doc": "one request, 1 block, every behaviour on: offload, recompute, async steps, no"
    " revoke, decode failure, retraction, two decode ranks, a restart, identity with a"
    " prefix, slots, a warm host cache, turns; one fault of any kind",
    "blocks": 1,
    "cap_p": 1,
    "cap_d": 2,
    "cap_h": 1,
    "prefix": 1,
    "dst_tp": 2,
    "offload": True,
    "recompute": True,
    "async_steps": True,
    "revocable": False,
    "decode_failure": True,
    "retract": True,
    "decode_ranks": True,
    "restarts": 1,
    "identity": True,
    "slots": True,
    "host_cache": 2,
    "turns": True,
    "window": True,  # switched on, but with 1 block the window keeps it: no prune here
    "faults": 1,
    "fault_kinds": frozenset(
        {"lose", "duplicate", "corrupt", "mismatch", "crash", "store_fail", "load_fail"}
    ),
    "max_attempts": 1,
}
COMPOSED["pair_window_host"] = {
    "doc": "one request, 2 blocks, sliding-window pruning with a cold shared host cache and"
    " async steps: the window never prunes under a store or a step in flight",
    "blocks": 2,
    "cap_p": 2,
    "cap_h": 2,
    "handoff": False,
    "cancel": False,
    "async_steps": True,
    "host_cache": 1,
    "window": True,
}
# Found by the sweep of every pair (tests/explorer/test_pairs_compose.py), each broke NoDeadlock
# or FairTermination before its fix (SPEC.md, "Behaviours that compose"): the smallest worlds.
_ONE = {"blocks": 1, "cap_p": 1, "cap_d": 1, "max_attempts": 1}
COMPOSED["pair_crash_turns"] = {
    "doc": "one request, 1 block, multi-turn append, a crash and no restart: a session left"
    " on decode by a prefill crash, then evicted, fails its turn (no prefill to compute it)",
    **_ONE,
    "faults": 1,
    "fault_kinds": _CRASH,
    "turns": True,
}
COMPOSED["pair_crash_retract"] = {
    "doc": "one request, 1 block, decode may retract its copy, a crash and no restart: a"
    " retraction after a prefill crash fails the request (nothing can compute it again)",
    **_ONE,
    "faults": 1,
    "fault_kinds": _CRASH,
    "retract": True,
}
COMPOSED["pair_prefix_layers"] = {
    "doc": "one request, 1 block, a 1-block prefix on decode, one streamed layer: a whole"
    " prefix hit lands no chunk, and its layers are installed from the prefix blocks",
    **_ONE,
    "cap_d": 2,
    "prefix": 1,
    "layers": 1,
}
PAIRS: tuple[str, ...] = tuple(k for k in COMPOSED if k.startswith("pair_"))
# Sliding-window pruning (spec/window/__init__.py): the default suite's world.
WINDOW: dict[str, dict[str, Any]] = {
    "window_prune": {
        "doc": "one request, 2 blocks, sliding-window pruning on prefill; a handoff or an"
        " offload (with recompute) of the copy; the window never prunes under a transfer",
        "blocks": 2,
        "cap_h": 2,
        "offload": True,
        "recompute": True,
        "max_attempts": 1,
        "window": True,
    },
}

__all__ = ["COMPOSED", "DERIVED", "DERIVED_DEEP", "DERIVED_DEFAULT", "PAIRS", "WINDOW"]
