"""Rejections (issue #25 item 4): ``reject_retry`` made small enough to explore.

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
it does not (a second attempt, the client's cancel): ``spec/config.py`` derives them from
``reject_retry`` with these fields replaced.
"""

from __future__ import annotations

from typing import Any

REJECT_WORLDS: dict[str, dict[str, Any]] = {
    "reject_dup": {
        "doc": "two requests, a decode pool that fits one: a rejection, then a duplicate of"
        " the rejected Handoff; one attempt, no cancel (reject_retry made small)",
        "cancel": False,
        "max_attempts": 1,
    },
}

__all__ = ["REJECT_WORLDS"]
