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
}

__all__ = ["DERIVED"]
