"""The reference engine: one method per spec action, over real torch pools.

``Engine`` (``core``) speaks the spec's action names, refuses what the spec disables with
a typed error naming the property (changing nothing), and maps its state to a spec state
(``abstract``). Prefill's actions live in ``prefill``, decode's in ``decode``, the
environment's faults in ``env``; ``base`` holds the records and the shared machinery,
``data`` the per-rank pools and seeded ground truth, ``wire`` the message encoding,
``copies`` prefill's data moves, ``restarts`` the incarnations; the engine behaviours of
``spec/behaviours`` have ``async_steps``/``inflight``, ``transfer_rules``, ``identity``
and the ``behaviours`` package (retraction, decode ranks, the shared host cache, turns,
streamed offers, sliding-window pruning).
"""

from refimpl.engine.base import (
    KNOWN_SWITCHES,
    STREAM_SWITCH,
    LoadStoreError,
    NotEnabled,
    RankError,
    UnpublishedError,
)
from refimpl.engine.core import Engine
from refimpl.engine.data import RankPools

__all__ = [
    "KNOWN_SWITCHES",
    "STREAM_SWITCH",
    "Engine",
    "LoadStoreError",
    "NotEnabled",
    "RankError",
    "RankPools",
    "UnpublishedError",
]
