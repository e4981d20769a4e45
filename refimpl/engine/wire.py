"""The network under the engine: the in-process transport, with selective delivery.

The spec's network is a multiset per request (``Req.net``): any message in flight may be
delivered next, lost, duplicated or corrupted. ``Wire`` is an ``InProcessTransport`` (JSON
headers plus byte payloads, nothing else crosses) with two channels per request,

    "<i>>d"   prefill -> decode: Handoff, Chunk (one-sided write), RankDone, Quiesced
    "<i>>p"   decode -> prefill: Ready, Ack, Nack

and a few calls the environment uses to choose what happens to one message in flight:
``take`` (deliver it), ``lose``, ``duplicate``, ``replace`` (a corrupted payload or a
swapped manifest) and ``drop_where`` (a crash fails every matching write; a fence or a
flush is ``revoke``, which takes nothing back on an unrevocable transport).
Reordering needs no call: the receiver takes whichever message the environment picks.

A header names its message: ``{"kind", "req", "epoch", "idx", ...}`` with the spec's
message names (``spec.state.MSG_NAMES``). The *Bad* kinds are never written by a sender;
``engine_abstract`` derives them from the bytes (a checksum or a manifest that fails).

Every header text is read by ``loads_header`` (``spec.strict_json.loads_strict``, the
project's one reader of untrusted JSON, under ``MAX_HEADER_CHARS`` and
``MAX_HEADER_DEPTH``): a text swapped in by ``replace`` is read before it is kept, so a
deep, huge, duplicate-keyed or non-finite header is refused there (``StrictJSONError``
naming it) and the entry is left as it was.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Final

from refimpl.transport import InProcessTransport, Payload
from spec.manifest import MAX_INT_DIGITS, MAX_JSON_CHARS, MAX_JSON_DEPTH
from spec.strict_json import loads_object

__all__ = [
    "MAX_HEADER_CHARS",
    "MAX_HEADER_DEPTH",
    "Entry",
    "Wire",
    "channel",
    "dumps",
    "loads_header",
    "parse",
]

# A header holds at most one manifest (capped at MAX_JSON_CHARS) and a few short fields.
MAX_HEADER_CHARS: Final = MAX_JSON_CHARS + (1 << 16)
# The header, then its manifest (MAX_JSON_DEPTH: the manifest, then rope or an array).
MAX_HEADER_DEPTH: Final = MAX_JSON_DEPTH + 1

Entry = tuple[str, Payload]  # (header as JSON text, payload), as the transport keeps it


def channel(req: int, to_decode: bool) -> str:
    return f"{req}>{'d' if to_decode else 'p'}"


def loads_header(text: str) -> dict[str, Any]:
    """A header text as a new dict, read strictly (``StrictJSONError`` naming what is
    wrong: too long, too deep, a duplicate key, a non-finite number, not an object)."""
    return loads_object(
        text, prefix="wire header", max_bytes=MAX_HEADER_CHARS, max_depth=MAX_HEADER_DEPTH,
        max_int_digits=MAX_INT_DIGITS, what="header",
    )  # fmt: skip


@lru_cache(maxsize=8192)
def parse(text: str) -> dict[str, Any]:
    """The header of an entry (cached by its text; callers must not mutate it)."""
    return loads_header(text)


def dumps(header: Mapping[str, Any]) -> str:
    return json.dumps(header, allow_nan=False, separators=(",", ":"))


class Wire(InProcessTransport):
    """In-process channels the environment can pick from (spec: a multiset per request)."""

    def __init__(self, *, revocable: bool = True) -> None:
        # Payloads by reference, like an RDMA read of registered (pinned) source memory:
        # the source must stay frozen until the write has landed (NoReuseUnderIO).
        super().__init__(copy_payload=False, revocable=revocable)

    def channels(self) -> list[str]:
        return sorted(self._queues)

    def entries(self, ch: str) -> tuple[Entry, ...]:
        """What is in flight on ``ch``, oldest first (read only)."""
        return tuple(self._queues.get(ch, ()))

    def find(self, ch: str, match: Callable[[str, Payload], bool]) -> int:
        """Index of the first entry on ``ch`` that ``match`` accepts, or -1."""
        for k, (text, data) in enumerate(self._queues.get(ch, ())):
            if match(text, data):
                return k
        return -1

    def take(self, ch: str, k: int) -> tuple[dict[str, Any], Payload]:
        """Deliver entry ``k`` of ``ch`` (the environment chose it)."""
        q = self._queues[ch]
        text, data = q[k]
        header = loads_header(text)  # read before anything moves
        del q[k]
        self.stats["delivered"] += 1
        return header, data

    def lose(self, ch: str, k: int) -> None:
        del self._queues[ch][k]
        self.stats["lost"] += 1

    def duplicate(self, ch: str, k: int) -> None:
        self._queues[ch].append(self._queues[ch][k])
        self.stats["duplicated"] += 1

    def replace(
        self, ch: str, k: int, text: str | None = None, data: Payload | None = None
    ) -> None:
        """Swap entry ``k``'s header text or payload (a fault in transit). A ``text`` that
        is not a header ``loads_header`` accepts is refused and nothing changes."""
        if text is not None:
            parse(text)
        old_text, old_data = self._queues[ch][k]
        new = (old_text if text is None else text, old_data if data is None else data)
        self._queues[ch][k] = new
        self.stats["corrupted"] += 1

    def drop_where(self, ch: str, pred: Callable[[dict[str, Any]], bool]) -> int:
        """Fail every entry of ``ch`` whose header ``pred`` accepts; returns how many."""
        q = self._queues.get(ch)
        if not q:
            return 0
        keep = deque(e for e in q if not pred(parse(e[0])))
        dropped = len(q) - len(keep)
        self._queues[ch] = keep
        self.stats["aborted"] += dropped
        return dropped

    def revoke(self, ch: str, pred: Callable[[dict[str, Any]], bool]) -> int:
        """Take back the posted writes of ``ch`` that ``pred`` accepts (a fence, a sender's
        flush); returns how many. On an unrevocable transport nothing can be: 0."""
        return self.drop_where(ch, pred) if self.revocable else 0
