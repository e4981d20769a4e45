"""The engine's side of ``spec.behaviours`` (and ``spec.window``): one mixin per
behaviour, each adding the spec's new actions (same names) on top of the core engine's
decode and env actions."""

from refimpl.engine.behaviours.decode_ranks import DecodeRankActions
from refimpl.engine.behaviours.host_cache import HostCacheActions
from refimpl.engine.behaviours.retract import RetractActions
from refimpl.engine.behaviours.stream import StreamActions
from refimpl.engine.behaviours.turns import TurnActions
from refimpl.engine.behaviours.window import WindowActions

__all__ = [
    "DecodeRankActions",
    "RetractActions",
    "HostCacheActions",
    "StreamActions",
    "TurnActions",
    "WindowActions",
]
