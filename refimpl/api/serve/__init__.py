"""Serving: the calls an engine makes once per step, for every request of one end.

``Progress`` wraps a ``Sender``/``Receiver`` (or one TP rank's ``RankSender`` /
``RankReceiver``): ``progress()`` advances every watched request, owns their deadlines,
and reports what finished sending, finished receiving, and failed (reasons and block
ids). See ``refimpl.api.serve.progress``.
"""

from refimpl.api.serve.progress import Failed, Progress, Step

__all__ = ["Failed", "Progress", "Step"]
