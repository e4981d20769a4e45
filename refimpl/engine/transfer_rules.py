"""The engine side of ``spec/behaviours``: rules the actions of several workers share.

- Writes that cannot be taken back (``Config.revocable``; the wire's ``revoke`` takes
  nothing back when it is False): ``may_fence``, ``writes_drained`` (the sender's batch
  status over every task of an attempt) and ``quarantine_over`` (decode's quarantine has
  outlived the writer). See ``spec/behaviours/irrevocable.py``.
- Decode's own failure of an attempt (``Config.decode_failure``): ``RxState.failed``,
  set by ``DecodeFail`` (``refimpl/engine/decode.py``). See
  ``spec/behaviours/decode_failure.py``.
"""

from __future__ import annotations

from refimpl.engine.base import EngineBase
from refimpl.engine.wire import channel, parse
from spec.state import AWAIT_READY, SENDING

__all__ = ["may_fence", "quarantine_over", "writes_drained"]


def may_fence(eng: EngineBase) -> bool:
    """Can decode stop an attempt's writes itself? Only on a revocable transport (the
    ``free_fenced_unrevocable`` bug believes it can on any)."""
    return eng.wire.revocable or "free_fenced_unrevocable" in eng.m


def writes_drained(eng: EngineBase, i: int, epoch: int) -> bool:
    """The sender's batch status: no write of ``epoch`` in flight, over every task. The
    ``batch_status_subset`` bug reads the first task (chunk 0) only."""
    first_only = "batch_status_subset" in eng.m
    for text, _ in eng.wire.entries(channel(i, True)):
        h = parse(text)
        if h["kind"] == "Chunk" and h["epoch"] == epoch and (not first_only or h["idx"] == 0):
            return False
    return True


def quarantine_over(eng: EngineBase, i: int) -> bool:
    """Decode's quarantine of attempt ``dep`` has outlived its writer: the sender posts no
    more writes of it and none is in flight (a quarantine timer longer than the sender's
    timeout plus the transport's bound on a write's lifetime)."""
    r, x = eng.req[i], eng.rx[i]
    sending = r.epoch == x.dep and r.phase in (AWAIT_READY, SENDING)
    return not sending and not eng._chunks_in_flight(i, x.dep)
