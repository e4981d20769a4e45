"""Serving: the calls an engine makes once per step, for every request of one end.

``Progress`` wraps a ``Sender``/``Receiver`` (or one TP rank's ``RankSender`` /
``RankReceiver``): ``progress()`` advances every watched request, owns their deadlines,
and reports what finished sending, finished receiving, and failed (reasons and block
ids). See ``refimpl.api.serve.progress``. ``handoff_groups`` hands off a request whose
KV lives in several cache groups (hybrid models: a sliding-window group beside a
full-attention one), each with its own geometry and block table: every group committed,
or none. See ``refimpl.api.serve.groups``.
"""

from refimpl.api.serve.groups import Group, group_request, handoff_groups
from refimpl.api.serve.progress import Failed, Progress, Step

__all__ = ["Failed", "Group", "Progress", "Step", "group_request", "handoff_groups"]
