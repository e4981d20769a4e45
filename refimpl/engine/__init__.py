"""The reference engine: one method per spec action, over real torch pools.

``Engine`` (``core``) speaks the spec's action names, refuses what the spec disables with
a typed error naming the property (changing nothing), and maps its state to a spec state
(``abstract``). Prefill's actions live in ``prefill``, decode's in ``decode``, the
environment's faults in ``env``; ``base`` holds the records and the shared machinery,
``data`` the seeded ground truth, ``wire`` the message encoding, ``copies`` prefill's
data moves, ``restarts`` the incarnations; the engine behaviours of ``spec/behaviours``
have ``async_steps``/``inflight``, ``transfer_rules``, ``identity`` and the
``behaviours`` package (retraction, decode ranks, the shared host cache, turns, streamed
offers, sliding-window pruning).

The data plane is the API's, one definition each: the pools (``refimpl.rankpools``), the
``Sender``'s freeze, chunk bytes and manifest (``refimpl.chunks``), the ``Receiver``'s
manifest gate (``refimpl.api.intake.manifest_gate``), chunk check
(``refimpl.api.install.chunk_intact``), source geometry and landing
(``refimpl.api.layers.source_of``/``land_shard``). The sequencing stays the spec's: one
method per action, so the refinement map and the bug switches hold; a write lands where
its header points, the blocks held or not (the mutants' damage, which ``Receiver``
refuses by design). The wire is the spec's messages one to one (``Handoff``, ``Chunk``,
``RankDone``, ``Quiesced``, ...; any in flight may be delivered, lost, duplicated or
corrupted), not the API's conversation (``seal``, ``abort``).
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
