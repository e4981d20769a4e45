"""Ranks agree: TP ranks each in their own process, on both sides of a handoff.

``Epochs`` chooses one epoch per attempt for every prefill rank; ``RankSender`` is one
prefill rank, ``RankReceiver`` one decode rank (a ``Receiver`` of its own heads); any
rank's end reaches every rank of both sides with its reason, and the request is ready
only once every decode rank installed. ``rank_route`` routes their channels over
``refimpl.transport_dist.DistTransport``. See ``refimpl.api.ranks.group``.
"""

from refimpl.api.ranks.group import Epochs, group_channel, rank_route, sub_id
from refimpl.api.ranks.receiver import RankReceiver
from refimpl.api.ranks.sender import RankSender

__all__ = ["Epochs", "RankReceiver", "RankSender", "group_channel", "rank_route", "sub_id"]
