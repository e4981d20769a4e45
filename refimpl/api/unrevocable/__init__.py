"""Writes that cannot be taken back (a transport with ``revocable = False``: one-sided
RDMA writes, a NIXL or Mooncake batch; spec ``Config.revocable=False``).

``ends``: a ``Sender``'s attempt ends (a nack, its abort, a sibling rank's) only once
none of its writes is pending at the transport, then says Quiesced. ``quarantine``: a
``Receiver`` that gives up an attempt while a write may land keeps its blocks
quarantined until every source rank's writer said Quiesced.
"""

from refimpl.api.unrevocable.ends import AttemptEnds
from refimpl.api.unrevocable.quarantine import Late, quiesce, quiesced

__all__ = ["AttemptEnds", "Late", "quiesce", "quiesced"]
