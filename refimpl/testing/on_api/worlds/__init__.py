"""The world-specific mixins of ``on_api.subject.ApiSubject``: the actions and registers
of one ``Config`` feature each (``restarts``: EnvRestart; ``streamed``: the layer
actions; ``failure``: DecodeFail; ``offload``: the host tier's moves, ``disk_offload``
the same to a DiskTier; ``recompute``: PrefillPreempt; ``host_cache``: the shared host
cache on a DiskTier; ``prefix``: decode's prefix cache, lent to the Receiver, and
its eviction)."""

from refimpl.testing.on_api.worlds.disk_offload import DiskOffloadActions
from refimpl.testing.on_api.worlds.failure import FailureActions
from refimpl.testing.on_api.worlds.host_cache import HostCacheActions
from refimpl.testing.on_api.worlds.offload import OffloadActions
from refimpl.testing.on_api.worlds.prefix import PrefixActions
from refimpl.testing.on_api.worlds.recompute import RecomputeActions
from refimpl.testing.on_api.worlds.restarts import RestartActions
from refimpl.testing.on_api.worlds.streamed import StreamedActions

__all__ = [
    "DiskOffloadActions",
    "FailureActions",
    "HostCacheActions",
    "OffloadActions",
    "PrefixActions",
    "RecomputeActions",
    "RestartActions",
    "StreamedActions",
]
